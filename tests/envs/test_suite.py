"""The TRON-style environment suite (envs/suite): generators, verifiers, levels, the online mix."""

import itertools
import re

import jax
import numpy as np
import pytest

from posttrain_jax import envs
from posttrain_jax.envs import suite

TASKS = sorted(n for n in envs.ENVS if n.startswith(suite.PREFIX))
CASES = [(name, level) for name in TASKS for level in envs.ENVS[name].levels]


def _numbers(text):
  return [int(x) for x in re.findall(r"-?\d+", text)]


def _min_period(s):
  return next(q for q in range(1, len(s) + 1) if all(s[i] == s[i + q] for i in range(len(s) - q)))


def _walk_end(moves):
  x = moves.count("R") - moves.count("L")
  y = moves.count("U") - moves.count("D")
  return x, y


def _visits(moves):
  pos, seen = (0, 0), {(0, 0)}
  for m in moves:
    pos = (pos[0] + (m == "R") - (m == "L"), pos[1] + (m == "U") - (m == "D"))
    seen.add(pos)
  return len(seen)


# Independent reference solvers that read only the prompt text (tag and '=' stripped).
REFERENCE = {
  "sub": lambda b: str(int(b.split("-")[0]) - int(b.split("-")[1])),
  "mul": lambda b: str(int(b.split("*")[0]) * int(b.split("*")[1])),
  "modsum": lambda b: str(sum(map(int, b.split("%")[0].split("+"))) % int(b.split("%")[1])),
  "count": lambda b: str(b[2:].count(b[0])),
  "distinct": lambda b: str(len(set(b))),
  "runs": lambda b: str(len(list(itertools.groupby(b)))),
  "progression": lambda b: str(2 * _numbers(b)[-1] - _numbers(b)[-2]),
  "repeat": lambda b: b[len(b) - _min_period(b)],
  "reverse": lambda b: b[::-1],
  "grid": lambda b: "%d %d" % _walk_end(b),
  "manhattan": lambda b: str(
    abs(_numbers(b)[0] - _numbers(b)[2]) + abs(_numbers(b)[1] - _numbers(b)[3])
  ),
  "visits": lambda b: str(_visits(b)),
  "max": lambda b: str(max(_numbers(b))),
  "sort": lambda b: "".join(sorted(b)),
  "bool": lambda b: str(
    int(
      eval(  # pylint: disable=eval-used  (test-only, generated text)
        b.replace("!", " not ").replace("&", " and ").replace("|", " or ")
      )
    )
  ),
  "parity": lambda b: str(b.count("1") % 2),
}


def test_suite_shape():
  assert len(TASKS) >= 12
  assert len(envs.SUITE) >= 4
  assert sorted(n for names in envs.SUITE.values() for n in names) == TASKS
  assert set(REFERENCE) == {n[len(suite.PREFIX) :] for n in TASKS}
  tags = [envs.ENVS[n].tag for n in TASKS]
  assert len(set(tags)) == len(tags)
  assert {"arithmetic", "countdown", "tron"} <= set(envs.ENVS)
  for bucket, names in envs.SUITE.items():
    assert set(envs.ENVS[f"tron:{bucket}"].envs) == set(names)
    held_out = set(envs.ENVS[f"tron:no_{bucket}"].envs)  # the complement: generalisation runs
    assert held_out.isdisjoint(names) and held_out | set(names) == set(TASKS)
  for name in envs.ENVS:  # a task's tokenizer holds its characters
    assert set(envs.ENVS[name].chars) <= set(envs.tokenizer_charset(name))
  assert set("0123456789+=") | set("0123456789+-*/() >:") <= set(envs.CHARSET)


@pytest.mark.parametrize("name,level", CASES)
def test_verifier_accepts_generators_answer(name, level):
  env = envs.ENVS[name]
  reference = REFERENCE[name[len(suite.PREFIX) :]]
  assert env.max_prompt_chars(level) <= 24 and env.max_answer_chars(level) <= 8
  for split in envs.SPLITS:
    problems = env.sample(jax.random.key(level), 100, level=level, split=split)
    assert len(problems) == 100
    for p in problems:
      assert env.verify(p, p.answer) == 1.0, p
      assert env.verify(p, f" {p.answer}\n") == 1.0
      assert p.env == name and p.level == level and p.uid == p.prompt
      assert envs.split_of(p.uid, env.eval_percent) == split
      assert p.prompt.startswith(env.tag) and p.prompt.endswith("=")
      assert reference(p.prompt[1:-1]) == p.answer, p
      assert len(p.prompt) <= env.max_prompt_chars(level)
      assert len(p.answer) <= env.max_answer_chars(level)
      assert set(p.prompt + p.answer) <= set(env.chars)


@pytest.mark.parametrize("name,level", CASES)
def test_splits_are_disjoint_and_deterministic(name, level):
  env = envs.ENVS[name]
  train = env.sample(jax.random.key(0), 300, level=level, split="train")
  evals = env.sample(jax.random.key(1), 50, level=level, split="eval")
  assert not {p.uid for p in train} & {p.uid for p in evals}
  assert env.sample(jax.random.key(0), 300, level=level, split="train") == train
  assert env.sample(jax.random.key(5), 300, level=level, split="train") != train


@pytest.mark.parametrize("name", TASKS)
def test_malformed_and_wrong_completions_score_zero(name):
  env = envs.ENVS[name]
  for level in env.levels:
    for p in env.sample(jax.random.key(3), 20, level=level, split="eval"):
      for bad in (
        "",
        "  ",
        None,
        7,
        b"1",
        p.prompt,
        p.answer + "0",
        "0" + p.answer,
        p.answer + "=",
        "x" * 10_000,
        "\x00",
        "é",
        p.answer[:-1],
        p.answer.replace(" ", ""),
      ):
        if isinstance(bad, str) and bad.strip() == p.answer:
          continue
        assert env.verify(p, bad) == 0.0, (p, bad)


@pytest.mark.parametrize("name", TASKS)
def test_levels_get_harder(name):
  """Instance size (prompt + answer length) rises with level and the instance space grows."""
  env = envs.ENVS[name]
  size, distinct = [], []
  for level in env.levels:
    problems = env.sample(jax.random.key(level), 500, level=level, split="train")
    size.append(np.mean([len(p.prompt) + len(p.answer) for p in problems]))
    distinct.append(len({p.uid for p in problems}))
  assert all(np.diff(size) > 0), size
  assert distinct[-1] > distinct[0] and max(distinct) == distinct[-1] == 500, distinct
  prompt_max = [env.max_prompt_chars(l) for l in env.levels]
  assert prompt_max == sorted(prompt_max) and prompt_max[-1] > prompt_max[0]


@pytest.mark.parametrize("name", TASKS)
def test_corpus_and_systematic_mistakes(name):
  env = envs.ENVS[name]
  level = env.levels[-1]
  clean = env.corpus(jax.random.key(0), 200, level=level, noise=0.0)
  problems = env.sample(jax.random.key(0), 200, level=level, split="train")
  assert clean == [(p.prompt, p.answer) for p in problems]
  noisy = env.corpus(jax.random.key(0), 200, level=level, noise=1.0)
  assert [c for _, c in noisy] == [env.wrong(p.data) for p in problems]
  assert np.mean([c != p.answer for (_, c), p in zip(noisy, problems)]) > 0.05
  assert all(set(c) <= set(env.chars) for _, c in noisy)
  half = env.corpus(jax.random.key(0), 200, level=level, noise=0.5)
  assert 0 < sum(h != c for h, c in zip(half, clean)) < 200
  with pytest.raises(ValueError, match="noise"):
    env.corpus(jax.random.key(0), 2, level=level, noise=-0.1)


def test_unknown_level_and_split():
  env = envs.ENVS["tron/sub"]
  with pytest.raises(ValueError, match="tron/sub level"):
    env.sample(jax.random.key(0), 1, level=99)
  with pytest.raises(ValueError, match="split"):
    env.sample(jax.random.key(0), 1, level=1, split="test")
  with pytest.raises(ValueError) as err:
    envs.get_env("nope")
  assert str(err.value).startswith("unknown env 'nope'; valid env names: ")
  listed = str(err.value).split("valid env names: ")[1].split(", ")
  assert listed == sorted(envs.ENVS) and "tron/sub" in listed


def test_bool_precedence_and_mistake():
  from posttrain_jax.envs.suite import logic

  assert logic.bool_eval("1|0&0") == 1 and logic.bool_eval("1|0&0", precedence=False) == 0
  assert logic.bool_eval("!(1|0)&1") == 0 and logic.bool_eval("!!1") == 1


# --- the online mix ---------------------------------------------------------------------------


def test_mixed_env_default_is_a_uniform_level_mix():
  env = envs.ENVS["tron"]
  assert env.levels == tuple(range(1, 9))
  assert (
    env.max_prompt_chars(1)
    == max(envs.ENVS[n].max_prompt_chars(envs.ENVS[n].levels[-1]) for n in TASKS)
    <= 24
  )
  problems = env.sample(jax.random.key(0), 800, level=7, split="train")
  assert {p.env for p in problems} == set(TASKS)
  for p in problems:
    sub = envs.ENVS[p.env]
    assert p.level == min(7, sub.levels[-1])
    assert env.verify(p, p.answer) == 1.0 and env.verify(p, p.answer + "x") == 0.0
    assert envs.split_of(p.uid, sub.eval_percent) == "train"
  assert env.sample(jax.random.key(0), 800, level=7, split="train") == problems
  evals = env.sample(jax.random.key(1), 200, level=7, split="eval")
  assert not {p.uid for p in evals} & {p.uid for p in problems}


def test_mixed_env_follows_a_mix():
  env = envs.ENVS["tron"]
  mix = [("tron/sub", 4, 3.0), ("tron/parity", 2, 1.0), ("tron/grid", 8, 0.0)]
  problems = env.sample(jax.random.key(2), 2000, split="eval", mix=mix)
  counts = {n: sum(p.env == n for p in problems) for n in ("tron/sub", "tron/parity", "tron/grid")}
  assert counts["tron/grid"] == 0
  assert abs(counts["tron/sub"] / 2000 - 0.75) < 0.04
  assert {(p.env, p.level) for p in problems} == {("tron/sub", 4), ("tron/parity", 2)}
  as_dict = env.sample(jax.random.key(2), 50, mix={"tron/sub": 4, "tron/parity": (2, 1.0)})
  assert {p.env for p in as_dict} <= {"tron/sub", "tron/parity"}
  fixed = env.with_mix(mix)
  assert fixed.sample(jax.random.key(2), 2000, level=1, split="eval") == problems
  corpus = fixed.corpus(jax.random.key(0), 100, noise=0.0)
  assert all(envs.ENVS["tron/sub"].tag == p[0] or p[0] == "E" for p, _ in corpus)


@pytest.mark.parametrize(
  "mix,match",
  [
    ([("tron/nope", 1, 1.0)], "unknown env"),
    ([("tron/sub", 9, 1.0)], "no level 9"),
    ([("tron/sub", 1, -1.0)], ">= 0"),
    ([("tron/sub", 1, 0.0)], "positive weight"),
    ([("tron/sub", 1)], "env_name, level, weight"),
  ],
)
def test_mixed_env_rejects_bad_mixes(mix, match):
  with pytest.raises(ValueError, match=match):
    envs.ENVS["tron"].sample(jax.random.key(0), 4, mix=mix)


def test_mixed_env_verify_rejects_foreign_problem():
  p = envs.ENVS["arithmetic"].sample(jax.random.key(0), 1, level=2)[0]
  with pytest.raises(ValueError, match="cannot verify"):
    envs.ENVS["tron:math"].verify(p, p.answer)
  assert envs.ENVS["tron:math"].env_levels()["tron/sub"] == list(range(1, 7))
