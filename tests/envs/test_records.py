"""Reasoning-data records (envs/records.py; methods_A.md section 15 (d)): schema validation
with errors that name the field, every record has a checkable signal whose verifier is
deterministic, round trips through the library's datasets (StaticDataset, the SFT reader) and
the RL stage's rollout dump."""

import json
import os

import jax
import pytest

from posttrain_jax import envs
from posttrain_jax.envs import catalogue, records
from posttrain_jax.methods import rollout_dump
from posttrain_jax.train import sft

ENV_NAMES = ("arithmetic", "chain", "countdown", "digit_sum", "long_mult")


def _problems(name, n=4):
  env = catalogue.ENVS[name]
  return env, env.sample(jax.random.key(0), n, level=env.levels[0])


@pytest.mark.parametrize("name", ENV_NAMES)
def test_round_trip_and_a_checkable_deterministic_signal(name):
  env, problems = _problems(name)
  for p in problems:
    r = records.from_problem(p, split="train")
    again = records.validate(json.loads(json.dumps(records.to_json(r))))
    assert again == r
    assert records.to_problem(again) == (p, "train")
    # every record names a check kind and a verifier that exists and scores its gold answer
    assert again.check.kind in records.CHECK_KINDS
    verifier = catalogue.ENVS[again.check.verifier]
    gold = [verifier.verify(p, again.behaviour.completion) for _ in range(3)]
    assert gold == [1.0, 1.0, 1.0]  # deterministic on repeated calls
    wrong = [verifier.verify(p, "?") for _ in range(3)]
    assert len(set(wrong)) == 1 and wrong[0] < 1.0


def _good():
  _, problems = _problems("chain", 1)
  return records.to_json(records.from_problem(problems[0], "7+5=2;#2", score=0.0))


@pytest.mark.parametrize(
  "path, value, message",
  [
    (("check", "kind"), "vibes", "record.check.kind is 'vibes'; it must be one of"),
    (("check", "granularity"), "token", "record.check.granularity is 'token'"),
    (("check", "verifier"), "", "record.check.verifier is empty"),
    (("provenance", "split"), "test", "record.provenance.split is 'test'"),
    (("provenance", "base_pass_rate"), 1.5, "a pass rate lies in [0, 1]"),
    (("provenance", "level"), "3", "record.provenance.level must be a int"),
    (("provenance", "source"), "web", "record.provenance.source is 'web'"),
    (("behaviour", "retries"), -1, "record.behaviour.retries is -1; a count is >= 0"),
    (("behaviour", "steps"), ["x"], "record.behaviour.steps[0] must be a JSON object"),
    (("prompt",), 7, "record.prompt must be a str"),
    (("schema",), 2, "schema 2 is not 1"),
  ],
)
def test_validation_names_the_field_and_the_fix(path, value, message):
  bad = _good()
  target = bad
  for key in path[:-1]:
    target = target[key]
  target[path[-1]] = value
  with pytest.raises(records.RecordError, match=message.replace("[", r"\[").replace("]", r"\]")):
    records.validate(bad)
  missing = _good()
  del missing["check"]["reference"]
  with pytest.raises(records.RecordError, match="record.check.reference is missing"):
    records.validate(missing)


def test_files_datasets_and_sft_read_records(tmp_path):
  _, problems = _problems("arithmetic", 6)
  path = str(tmp_path / "data.jsonl")
  assert (
    records.write_records(path, [records.from_problem(p, split="train") for p in problems]) == 6
  )
  assert [records.to_problem(r)[0] for r in records.read_records(path)] == problems
  ds = envs.StaticDataset(path, check=True)
  assert ds.pool(split="train") == problems
  pairs = sft.read_examples(path)
  assert pairs == [(p.prompt, p.answer) for p in problems]
  with open(path, "a", encoding="utf-8") as f:
    f.write(json.dumps({**_good(), "check": {"kind": "rule"}}) + "\n")
  with pytest.raises(records.RecordError, match=r"data.jsonl:7.check.granularity is missing"):
    records.read_records(path)
  with pytest.raises(envs.DatasetError, match=r"data.jsonl:7"):
    envs.StaticDataset(path)


def test_rl_rollout_dump_writes_records_of_every_row(tmp_path):
  import rl_fixtures as fx  # noqa: PLC0415  (tests/train's helpers)

  c = fx.smoke_config(2)
  c.rl.dump_rollouts.every = 1
  fx.run(tmp_path / "run", c)
  path = tmp_path / "run" / "rl" / rollout_dump.FILE
  got = records.read_records(str(path))
  rows = c.rl.prompts_per_step * c.rl.group_size
  assert len(got) == 2 * rows and [r.provenance.step for r in got] == [0] * rows + [1] * rows
  env = catalogue.ENVS[c.env.name]
  for r in got:
    problem, _ = records.to_problem(r)
    assert r.provenance.source == "model" and r.provenance.source_model.startswith("policy@v")
    assert r.check.score == env.verify(problem, r.behaviour.completion)
  # a resumed run first drops the steps it redoes
  dump = rollout_dump.Dump(str(path))
  dump.trim(1)
  assert [r.provenance.step for r in records.read_records(str(path))] == [0] * rows


@pytest.fixture(autouse=True)
def _train_helpers(monkeypatch):
  monkeypatch.syspath_prepend(os.path.join(os.path.dirname(__file__), "..", "train"))
