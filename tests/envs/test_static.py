"""envs.static: a generated dataset written to JSONL and read back as an env-like source; GSM8K-
and MATH-style question/answer files read and scored by the math rule."""

import json
import pickle

import jax
import pytest

from posttrain_jax import envs
from posttrain_jax.envs import static


@pytest.mark.parametrize(
  "name,level",
  [("tron/sub", 3), ("tron/grid", 2), ("countdown", 3), ("arithmetic", 2), ("tron", 4)],
)
def test_round_trip(tmp_path, name, level):
  path = str(tmp_path / "data" / f"{name.replace('/', '_')}.jsonl")
  problems = static.write_dataset(path, name, jax.random.key(7), 60, level=level)
  ds = static.StaticDataset(path)
  assert ds.problems == problems and len(ds) == 60
  assert ds.splits == ["train"] * 60
  for p in ds.problems:
    assert ds.verify(p, p.answer) == 1.0 and ds.verify(p, p.answer + "7") == 0.0
    assert ds.verify(p, None) == 0.0
  assert set(ds.chars) <= set(envs.CHARSET)
  assert ds.max_prompt_chars() == max(len(p.prompt) for p in problems)
  assert ds.max_answer_chars(level) == max(len(p.answer) for p in problems)


def test_sampling_is_seeded_and_covers_the_pool(tmp_path):
  path = str(tmp_path / "mix.jsonl")
  sub = envs.ENVS["tron/sub"].sample(jax.random.key(0), 10, level=2, split="train")
  par = envs.ENVS["tron/parity"].sample(jax.random.key(0), 5, level=3, split="eval")
  static.write_jsonl(path, sub, split="train")
  with open(path, "a", encoding="utf-8") as f:  # no split field: hashed like the env
    for p in par:
      record = static.problem_to_record(p)
      f.write(json.dumps(record) + "\n\n")
  ds = static.StaticDataset(path)
  assert ds.levels == (2, 3) and ds.envs == ("tron/parity", "tron/sub")
  assert ds.pool(split="eval") == par and ds.pool(level=2) == sub
  first = ds.sample(jax.random.key(1), 10, level=2)
  assert sorted(p.uid for p in first) == sorted(p.uid for p in sub)  # one full epoch
  assert ds.sample(jax.random.key(1), 25, level=2) == ds.sample(jax.random.key(1), 25, level=2)
  assert ds.sample(jax.random.key(1), 25, level=2)[:10] == first
  assert ds.sample(jax.random.key(2), 10, level=2) != first
  with pytest.raises(ValueError, match="no level 9"):
    ds.sample(jax.random.key(0), 1, level=9)
  with pytest.raises(ValueError, match="no eval problems at level 2"):
    ds.sample(jax.random.key(0), 1, level=2, split="eval")


def test_noisy_corpus_uses_the_named_envs_mistake(tmp_path):
  path = str(tmp_path / "bool.jsonl")
  problems = static.write_dataset(path, "tron/bool", jax.random.key(0), 40, level=3)
  ds = static.StaticDataset(path)
  clean = ds.corpus(jax.random.key(3), 40, noise=0.0)
  assert all(c == next(p.answer for p in problems if p.prompt == q) for q, c in clean)
  noisy = ds.corpus(jax.random.key(3), 40, noise=1.0)
  env = envs.ENVS["tron/bool"]
  assert [c for _, c in noisy] == [env.wrong_answer(p) for p in ds.sample(jax.random.key(3), 40)]
  arith = str(tmp_path / "arith.jsonl")
  static.write_dataset(arith, "arithmetic", jax.random.key(0), 4, level=2)
  with pytest.raises(ValueError, match="no systematic wrong answer"):
    static.StaticDataset(arith).corpus(jax.random.key(0), 4, noise=1.0)


GOOD = {
  "prompt": "S25-27=",
  "answer": "-2",
  "env": "tron/sub",
  "level": 2,
  "uid": "S25-27=",
  "data": [2, 25, 27],
  "split": "train",
}


@pytest.mark.parametrize(
  "line,match",
  [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (
      json.dumps({k: v for k, v in GOOD.items() if k != "answer"}),
      r"missing field\(s\) \['answer'\]",
    ),
    (json.dumps({**GOOD, "level": "2"}), "'level' must be an integer"),
    (json.dumps({**GOOD, "prompt": 5}), "'prompt' must be a string"),
    (json.dumps({**GOOD, "split": "test"}), "'split' must be one of"),
    (json.dumps({**GOOD, "env": "tron/nope"}), "unknown env 'tron/nope'"),
    (json.dumps({**GOOD, "answer": "2"}), "stored answer '2' does not verify"),
    (json.dumps({**GOOD, "data": [2, 25]}), "is not a valid tron/sub state"),
    (
      json.dumps(
        {
          "prompt": "3 5 12>21:",
          "answer": "3*5+12",
          "env": "countdown",
          "level": 3,
          "data": [[3, 5, 12], 21],
        }
      ),
      "'3\\*5\\+12' does not verify",
    ),
  ],
)
def test_malformed_line_names_file_line_and_problem(tmp_path, line, match):
  path = tmp_path / "bad.jsonl"
  path.write_text(json.dumps(GOOD) + "\n\n" + line + "\n", encoding="utf-8")
  with pytest.raises(static.DatasetError, match=match) as err:
    static.StaticDataset(str(path))
  assert str(err.value).startswith(f"{path}:3: ")


def test_missing_empty_unknown_suffix_and_custom_reader(tmp_path):
  with pytest.raises(FileNotFoundError, match="no dataset file"):
    static.StaticDataset(str(tmp_path / "absent.jsonl"))
  empty = tmp_path / "empty.jsonl"
  empty.write_text("\n", encoding="utf-8")
  with pytest.raises(static.DatasetError, match="no problems"):
    static.StaticDataset(str(empty))
  with pytest.raises(static.DatasetError, match="no reader for '.arrayrecord'"):
    static.StaticDataset(str(tmp_path / "x.arrayrecord"))
  reader = lambda path: [
    (1, dict(GOOD)),
    (2, {**GOOD, "prompt": "S25-28=", "uid": "S25-28=", "answer": "-3", "data": [2, 25, 28]}),
  ]
  ds = static.StaticDataset("in-memory.records", reader=reader)
  assert len(ds) == 2 and ds.problems[0].data == (2, 25, 27)
  assert ds.verify(ds.problems[1], "-3") == 1.0


# The question/answer layout of public math datasets, scored by the 'math' rule (math-verify).
GSM8K = [
  {
    "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as "
    "many clips in May. How many clips did Natalia sell altogether?",
    "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether.\n#### 72",
  },
  {
    "question": "A shop sells 1,000 pens a day for 2 days. How many pens?",
    "answer": "1,000 * 2 = 2,000\n#### 2,000",
  },
  {
    "question": "It is 5 degrees and drops 8. What is the temperature?",
    "answer": "5 - 8 = -3\n#### -3",
    "split": "eval",
  },
]
MATH = [
  {
    "problem": "What is $\\frac{1}{4} + \\frac{1}{4}$?",
    "level": "Level 1",
    "solution": "We add: $\\frac{1}{4}+\\frac{1}{4} = \\boxed{\\frac{1}{2}}$.",
    "unique_id": "test/prealgebra/1.json",
  },
  {"problem": "What is 6 times 7?", "answer": 42, "level": 2, "id": 17},
  {
    "problem": "Expand $(x+1)^2$.",
    "level": "Level 3",
    "solution": "First $\\boxed{2}$ terms... so $(x+1)^2 = \\boxed{x^2+2x+1}$.",
  },
  {"problem": "Simplify $\\sqrt{8}$.", "answer": "2\\sqrt{2}", "level": "Level ?"},
]


def _write(path, records):
  path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
  return str(path)


def test_gsm8k_layout_is_read_and_scored(tmp_path):
  ds = static.StaticDataset(_write(tmp_path / "gsm8k.jsonl", GSM8K))
  assert [p.answer for p in ds.problems] == ["72", "2000", "-3"]
  assert [p.prompt for p in ds.problems] == [r["question"] for r in GSM8K]
  assert ds.envs == ("math",) and ds.levels == (0,)
  assert ds.problems[0].uid == GSM8K[0]["question"] and ds.splits[2] == "eval"
  first, pens, cold = ds.problems
  assert ds.verify(first, "48/2 = 24 in May, so 48 + 24 = 72.\n#### 72") == 1.0
  assert ds.verify(first, "48/2 = 24 in May, so 48 + 24 = 72.\n#### 73") == 0.0
  assert ds.verify(first, "She sold 72 clips in total.") == 1.0  # the last number
  assert ds.verify(first, "<think>48+24</think><answer>72</answer>") == 1.0
  assert ds.verify(pens, r"The answer is $\boxed{2,000}$.") == 1.0
  assert ds.verify(pens, "The answer is 2000 pens.") == 1.0
  assert ds.verify(pens, "The answer is 200.") == 0.0
  assert ds.verify(cold, "Answer: -3") == 1.0 and ds.verify(cold, "Answer: 3") == 0.0
  assert ds.sample(jax.random.key(0), 4) != []  # the train split streams


def test_math_layout_is_read_and_scored(tmp_path):
  ds = static.StaticDataset(_write(tmp_path / "math.jsonl", MATH))
  assert [p.answer for p in ds.problems] == [r"\frac{1}{2}", "42", "x^2+2x+1", r"2\sqrt{2}"]
  assert [p.level for p in ds.problems] == [1, 2, 3, 0]
  assert [p.uid for p in ds.problems[:2]] == ["test/prealgebra/1.json", "17"]
  assert ds.levels == (0, 1, 2, 3)
  half, times, square, root = ds.problems
  assert ds.verify(half, r"so \boxed{0.5}") == 1.0 and ds.verify(half, r"\boxed{1/4}") == 0.0
  assert ds.verify(square, r"\boxed{(x+1)^2}") == 1.0
  assert ds.verify(square, r"\boxed{x^2+1}") == 0.0
  assert ds.verify(root, r"The answer is $\sqrt{8}$.") == 1.0
  assert ds.verify(times, r"\boxed{42}") == 1.0
  clone = pickle.loads(pickle.dumps(ds))  # as the reward workers get it
  assert clone.verify(half, r"\boxed{\frac{2}{4}}") == 1.0


def test_the_prompt_answer_layout_may_name_the_math_rule(tmp_path):
  record = {"prompt": "1/2 + 1/4 =", "answer": "3/4", "env": "math", "level": 1}
  ds = static.StaticDataset(_write(tmp_path / "mine.jsonl", [record]))
  assert ds.verify(ds.problems[0], "that is 0.75") == 1.0
  assert ds.verify(ds.problems[0], "that is 0.7") == 0.0


@pytest.mark.parametrize(
  "record,match",
  [
    ({"question": "Q?"}, r"missing field 'answer' \(or a 'solution'"),
    ({"problem": "Q?", "solution": "no box here"}, r"'solution' has no \\boxed\{...\} answer"),
    ({"problem": "Q?", "solution": 3}, "field 'solution' must be a string"),
    ({"question": 5, "answer": "#### 3"}, "field 'question' must be a string"),
    ({"question": "Q?", "answer": ["3"]}, "field 'answer' must be a string or a number"),
    ({"question": "Q?", "answer": "#### 3", "level": 2.5}, "field 'level' must be an integer"),
    ({"question": "Q?", "answer": "#### 3", "split": "test"}, "'split' must be one of"),
    ({"question": "Q?", "answer": "#### 3", "id": [7]}, "field 'id' must be a string or an int"),
    ({"question": "Q?", "answer": "#### 3", "env": "nope"}, "unknown env 'nope'"),
    ({"question": "Q?", "answer": "work\n#### "}, "the stored answer is blank"),
  ],
)
def test_malformed_question_answer_record_names_file_and_line(tmp_path, record, match):
  path = tmp_path / "bad.jsonl"
  path.write_text(json.dumps(GSM8K[0]) + "\n\n" + json.dumps(record) + "\n", encoding="utf-8")
  with pytest.raises(static.DatasetError, match=match) as err:
    static.StaticDataset(str(path))
  assert str(err.value).startswith(f"{path}:3: ")
