"""config.reward.terms (rewards/terms.py): a user's reward functions by file path or module,
weighted sums and their per-term values against hand-computed ones, and the four bad cases
(raises, hangs, NaN, not a number) each failing only its own term, counted and named once."""

import textwrap
import time

import jax
import numpy as np
import pytest

from posttrain_jax import envs, rewards
from posttrain_jax.registry import ConfigError
from posttrain_jax.rewards import terms

USER = textwrap.dedent('''
    import math
    import time

    from posttrain_jax.rewards import catalogue

    def bonus(problem, completion, value=1.0):
      return value

    def length(problem, completion):
      return {"chars": float(len(completion)), "half": 0.5}

    def raises(problem, completion):
      raise KeyError("boom")

    def hangs(problem, completion):
      time.sleep(100)

    def nan(problem, completion):
      return math.nan

    def text(problem, completion):
      return "1.0"

    @catalogue.batched
    def first_char_is_digit(problems, completions, *, run, scale=1.0):
      return [scale * float(c[:1].isdigit()) for c in completions]

    @catalogue.batched
    def batched_nan(problems, completions, *, run):
      return [float("nan") if i % 2 else 1.0 for i in range(len(completions))]
''')


@pytest.fixture(scope="module")
def user_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("user") / "my_rewards.py"
  path.write_text(USER)
  return str(path)


@pytest.fixture(scope="module")
def batch():
  env = envs.get_env("arithmetic")
  problems = env.sample(jax.random.key(0), 4, level=1)
  texts = [problems[0].answer, problems[1].answer, "x7", "9"]
  correct = np.asarray([float(t == p.answer) for p, t in zip(problems, texts)])
  return env, problems, texts, correct


def _score(cfg, batch, workers=0, timeout=0.5, out=None):
  env, problems, texts, _ = batch
  rs = rewards.RewardSet.from_config(cfg, rewards.RunInfo(), out=out)
  scorer = rewards.Scorer(timeout=timeout, workers=workers, max_error_rate=1.0, out=out)
  return rs, rs.score(scorer, env, problems, texts, env="arithmetic")


def test_default_is_the_verifier_alone_and_plain():
  (term,) = terms.parse({})
  assert (term.name, term.fn, term.weight) == ("correct", "env", 1.0)
  assert rewards.RewardSet.from_config({}, rewards.RunInfo()).is_plain
  assert not rewards.RewardSet.from_config({"correct": {"weight": 2.0}}, rewards.RunInfo()).is_plain


@pytest.mark.parametrize(
  "cfg,match",
  [
    ({"nope": {}}, "unknown reward 'nope'; valid reward names"),
    ({"b": {"fn": "missing_file.py:f"}}, "reward file 'missing_file.py' does not exist"),
    ({"b": {"fn": "posttrain_jax.rewards.catalogue:no_such"}}, "has no function 'no_such'"),
    ({"b": {"fn": "no_such_module_xyz:f"}}, "cannot import the reward"),
    (
      {"b": {"fn": "posttrain_jax.rewards.catalogue:resolve", "weight": float("nan")}},
      "weight must be a finite number",
    ),
    ({"b": {"fn": "posttrain_jax.rewards.catalogue:resolve", "wieght": 1}}, "unknown key"),
    ({"correct": {"fn": "x:y"}}, "is the env's own verifier"),
  ],
)
def test_bad_terms_name_the_key_and_the_fix(cfg, match):
  with pytest.raises(ConfigError, match=match):
    terms.parse(cfg)


def test_weighted_sum_and_components_match_a_hand_computation(user_file, batch):
  _, _, texts, correct = batch
  cfg = {
    "correct": {"weight": 2.0},
    "bonus": {"fn": f"{user_file}:bonus", "weight": 0.5, "kwargs": {"value": 3.0}},
    "length": {"fn": f"{user_file}:length", "weight": -0.1},
    "digit": {"fn": f"{user_file}:first_char_is_digit", "weight": 4.0, "kwargs": {"scale": 0.5}},
  }
  rs, (total, codes, comps, errs) = _score(cfg, batch)
  chars = np.asarray([len(t) for t in texts], float)
  digit = np.asarray([0.5 * t[:1].isdigit() for t in texts])
  expected = 2.0 * correct + 0.5 * 3.0 - 0.1 * (chars + 0.5) + 4.0 * digit
  np.testing.assert_allclose(total, expected, rtol=1e-6)
  assert not codes.any() and not any(e.any() for e in errs.values())
  np.testing.assert_allclose(comps["length/chars"], chars)
  np.testing.assert_allclose(comps["length"], chars + 0.5)
  np.testing.assert_allclose(comps["digit"], digit)
  m = rs.metrics(comps, errs, mask=np.asarray([1, 1, 1, 0]))
  assert m["reward/correct"] == pytest.approx(correct[:3].mean())
  assert m["reward/length/chars"] == pytest.approx(chars[:3].mean())
  assert m["reward/bonus/errors"] == 0.0


def test_each_bad_case_fails_only_its_term_counted_and_named_once(user_file, batch, tmp_path):
  _, problems, _, correct = batch
  cfg = {name: {"fn": f"{user_file}:{name}"} for name in ("raises", "nan", "text", "bonus")}
  cfg["half_nan"] = {"fn": f"{user_file}:batched_nan"}
  log = open(tmp_path / "err.txt", "w+")
  rs, (total, codes, comps, errs) = _score(cfg, batch, out=log)
  # Only the good terms count: correct + bonus (1.0) + batched_nan's finite rows (1.0).
  half = np.asarray([1.0, 0.0, 1.0, 0.0])
  np.testing.assert_allclose(total, correct + 1.0 + half)
  assert (codes == rewards.outcomes.CODES["raised"]).all()  # a row's first failure
  for name in ("raises", "nan", "text"):
    assert errs[name].all() and (comps[name] == 0).all()
  np.testing.assert_array_equal(errs["half_nan"], half == 0)
  assert not errs["bonus"].any() and not errs["correct"].any()
  rs.score(
    rewards.Scorer(timeout=0.5, workers=0, max_error_rate=1.0, out=log),
    batch[0],
    problems,
    batch[2],
    env="arithmetic",
  )  # again: no new warning
  log.seek(0)
  lines = log.read().splitlines()
  warned = [l for l in lines if l.startswith("warning: reward term")]
  assert len(warned) == 4, lines
  by_term = {l.split("'")[1]: l for l in warned}
  assert f"({user_file}:raises) failed (raised) on problem {problems[0].uid!r}" in by_term["raises"]
  assert "KeyError: 'boom'" in by_term["raises"]
  assert "failed (nonfinite)" in by_term["nan"] and "returned nan" in by_term["nan"]
  assert "failed (non_numeric)" in by_term["text"] and "'1.0' (str)" in by_term["text"]
  assert "returned 2 non-finite value(s) of 4" in by_term["half_nan"]


def test_a_hanging_term_costs_its_own_timeout_in_the_workers(user_file, batch, tmp_path):
  _, _, _, correct = batch
  cfg = {"hangs": {"fn": f"{user_file}:hangs"}, "bonus": {"fn": f"{user_file}:bonus"}}
  log = open(tmp_path / "err.txt", "w+")
  start = time.monotonic()
  rs, (total, codes, comps, errs) = _score(cfg, batch, workers=2, timeout=0.3, out=log)
  assert time.monotonic() - start < 60
  np.testing.assert_allclose(total, correct + 1.0)  # the other terms still count
  assert (codes == rewards.outcomes.CODES["timeout"]).all() and errs["hangs"].all()
  log.seek(0)
  (line,) = [l for l in log.read().splitlines() if l.startswith("warning: reward term")]
  assert "'hangs'" in line and "failed (timeout)" in line and "no result within 0.3 s" in line


def test_registered_names_resolve_and_module_specs_import():
  rewards.REWARDS["_test_const"] = lambda problem, completion: 0.25
  try:
    assert terms.parse({"_test_const": {}})[1].fn == "_test_const"
  finally:
    del rewards.REWARDS["_test_const"]
  fn = rewards.resolve("posttrain_jax.rewards.catalogue:is_batched")
  assert fn is rewards.catalogue.is_batched
