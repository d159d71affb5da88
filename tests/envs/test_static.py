"""envs.static: a generated dataset written to JSONL and read back as an env-like source."""

import json

import jax
import pytest

from posttrain_jax import envs
from posttrain_jax.envs import static


@pytest.mark.parametrize("name,level", [("tron/sub", 3), ("tron/grid", 2), ("countdown", 3),
                                        ("arithmetic", 2), ("tron", 4)])
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
  with open(path, "a", encoding="utf-8") as f:           # no split field: hashed like the env
    for p in par:
      record = static.problem_to_record(p)
      f.write(json.dumps(record) + "\n\n")
  ds = static.StaticDataset(path)
  assert ds.levels == (2, 3) and ds.envs == ("tron/parity", "tron/sub")
  assert ds.pool(split="eval") == par and ds.pool(level=2) == sub
  first = ds.sample(jax.random.key(1), 10, level=2)
  assert sorted(p.uid for p in first) == sorted(p.uid for p in sub)   # one full epoch
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


GOOD = {"prompt": "S25-27=", "answer": "-2", "env": "tron/sub", "level": 2, "uid": "S25-27=",
        "data": [2, 25, 27], "split": "train"}


@pytest.mark.parametrize("line,match", [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "answer"}), r"missing field\(s\) \['answer'\]"),
    (json.dumps({**GOOD, "level": "2"}), "'level' must be an integer"),
    (json.dumps({**GOOD, "prompt": 5}), "'prompt' must be a string"),
    (json.dumps({**GOOD, "split": "test"}), "'split' must be one of"),
    (json.dumps({**GOOD, "env": "tron/nope"}), "unknown env 'tron/nope'"),
    (json.dumps({**GOOD, "answer": "2"}), "stored answer '2' does not verify"),
    (json.dumps({**GOOD, "data": [2, 25]}), "is not a valid tron/sub state"),
    (json.dumps({"prompt": "3 5 12>21:", "answer": "3*5+12", "env": "countdown", "level": 3,
                 "data": [[3, 5, 12], 21]}), "'3\\*5\\+12' does not verify"),
])
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
  reader = lambda path: [(1, dict(GOOD)), (2, {**GOOD, "prompt": "S25-28=", "uid": "S25-28=",
                                                 "answer": "-3", "data": [2, 25, 28]})]
  ds = static.StaticDataset("in-memory.records", reader=reader)
  assert len(ds) == 2 and ds.problems[0].data == (2, 25, 27)
  assert ds.verify(ds.problems[1], "-3") == 1.0
