"""envs/code.py: prompts and hidden tests are what the function gives, each prompt pins its
function down, equivalent expressions pass through the sandbox, wrong ones fail, and the
problems survive a JSONL dataset."""

import json

import jax
import pytest

from posttrain_jax import envs
from posttrain_jax.envs import code, static
from posttrain_jax.rewards import code_tests

ENV = envs.ENVS["code"]


def _value(expression: str, a: int) -> int:
  """The reference: Python itself evaluating the table's (trusted) expression."""
  return eval(expression, {"__builtins__": {}}, {"a": a})  # pylint: disable=eval-used


def test_family_functions_match_their_expressions():
  for family, params in code.members(4):
    text = code.expression(family, params)
    for a in range(code.HIDDEN_RANGE):
      assert code.evaluate(family, params, a) == _value(text, a), (text, a)
  sizes = {lvl: len(code.members(lvl)) for lvl in code.LEVELS}
  assert sizes == {1: 26, 2: 82, 3: 103, 4: 196}  # 9+9+8; +4*9+10+10; +5+4+12; +64+4+25


@pytest.mark.parametrize("level", code.LEVELS)
def test_prompts_tests_and_uniqueness(level):
  problems = ENV.sample(jax.random.key(level), 100, level=level, split="train")
  members = [code.expression(f, p) for f, p in code.members(level)]
  for p in problems:
    pairs = [tuple(int(v) for v in item.split("=")) for item in p.prompt[:-1].split(" ")]
    assert len(pairs) == code.SHOWN and p.prompt.endswith(":")
    assert all(_value(p.answer, a) == y for a, y in pairs)
    template, entry, cases = p.data[:3]
    assert (template, entry) == (code.TEMPLATE, "f") and len(cases) == code.HIDDEN
    hidden = [args[0] for args, _ in cases]
    assert not set(hidden) & {a for a, _ in pairs}
    assert all(_value(p.answer, a) == want for (a,), want in cases)
    # every expression of the level that fits the shown examples passes every hidden test
    fits = [m for m in members if all(_value(m, a) == y for a, y in pairs)]
    assert p.answer in fits
    assert all(_value(m, a) == want for m in fits for (a,), want in cases)
    assert len(p.prompt) <= ENV.max_prompt_chars(level)
    assert len(p.answer) <= ENV.max_answer_chars(level)
    assert set(p.prompt + p.answer) <= set(ENV.chars) <= set(envs.CHARSET)
    assert ENV.rebuild(p) == p
  assert len({p.data[3] for p in problems}) > 1
  assert {p.data[3] for p in problems} <= {f for f, _ in code.members(level)}


def _problem():
  # 3*a+1 shown at 4..7, hidden at 0..3 and 16..19
  return ENV.make("{0}*a+{1}", (3, 1), (4, 5, 6, 7), (0, 1, 2, 3, 16, 17, 18, 19), 2)


def test_equivalent_answers_pass_and_wrong_ones_fail():
  p = _problem()
  assert p.prompt == "4=13 5=16 6=19 7=22:" and p.answer == "3*a+1"
  for right in ("3*a+1", " a*3+1 ", "1+a+a+a", "(a<<1)+a+1", "sum([a, a, a, 1])"):
    assert ENV.verify(p, right) == 1.0, right
  for wrong in ("3*a+2", "a*a", "3*a+1 if a < 10 else 0", "22", "", "3*a+", None):
    assert ENV.verify(p, wrong) == 0.0, wrong
  # the term gives partial credit where the env's verifier is all-or-nothing
  assert code_tests.code_tests(p, "3*a+1 if a < 10 else 0") == 0.5  # hidden 0..3 pass


def test_errors():
  with pytest.raises(ValueError, match="level must be in 1..4"):
    ENV.sample(jax.random.key(0), 1, level=5)
  with pytest.raises(ValueError, match="has no function"):
    ENV.make("(a>{0})*{1}", (3, 4), (4, 5, 6, 7), tuple(range(8, 16)), 2)  # a level-4 family
  with pytest.raises(ValueError, match="distinct"):
    ENV.make("a+{0}", (3,), (4, 5, 6, 6), tuple(range(8, 16)), 1)
  with pytest.raises(ValueError, match="corpus noise"):
    ENV.corpus(jax.random.key(0), 2, level=1, noise=2.0)


def test_corpus_and_noise():
  clean = ENV.corpus(jax.random.key(0), 50, level=3, noise=0.0)
  problems = {p.prompt: p for p in ENV.sample(jax.random.key(0), 50, level=3, split="train")}
  assert [a for _, a in clean] == [problems[q].answer for q, _ in clean]
  noisy = ENV.corpus(jax.random.key(0), 50, level=3, noise=1.0)
  members = {code.expression(f, p) for f, p in code.members(3)}
  for prompt, answer in noisy:
    cases = problems[prompt].data[2]
    assert answer in members
    assert any(_value(answer, a) != want for (a,), want in cases)


def test_a_jsonl_dataset_of_code_problems(tmp_path):
  path = str(tmp_path / "code.jsonl")
  written = static.write_dataset(path, "code", jax.random.key(3), 3, level=4)
  data = static.StaticDataset(path)  # checks rebuild and that every stored answer verifies
  assert [p.answer for p in data.problems] == [p.answer for p in written]
  assert [p.data for p in data.problems] == [p.data for p in written]
  p = data.problems[0]
  assert data.verify(p, p.answer) == 1.0 and data.verify(p, p.answer + "+1") == 0.0
  with open(path, encoding="utf-8") as f:
    record = json.loads(f.readline())
  record["answer"] = "a+1"
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps(record) + "\n", encoding="utf-8")
  with pytest.raises(envs.DatasetError, match="does not verify"):
    static.StaticDataset(str(bad))
