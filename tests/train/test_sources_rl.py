"""Where prompts come from, in the RL loop: a static dataset in epochs, a curriculum over a
mixed online env, DAPO dynamic sampling, a rollout budget and a held-out env. Each runs from
config; the stateful ones resume exactly like an uninterrupted run."""

import json

import jax
import pytest
import rl_fixtures as fx

from posttrain_jax import envs
from posttrain_jax.envs import static as envs_static
from posttrain_jax.methods import validate
from posttrain_jax.train import prompts as prompts_lib
from posttrain_jax.train.validate import ConfigError

pytestmark = pytest.mark.usefixtures("coin_env")  # tests/train/conftest.py


@pytest.fixture
def dataset(tmp_path):
  path = str(tmp_path / "train.jsonl")
  problems = envs_static.write_dataset(path, "arithmetic", jax.random.key(7), 8, level=3)
  return path, problems


def _dataset_config(path, steps):
  c = fx.smoke_config(steps)
  c.env.dataset = path
  return c


def test_dataset_source_walks_epochs(dataset):
  path, problems = dataset
  c = _dataset_config(path, 4)
  source = prompts_lib.PromptSource(c, envs.get_env("arithmetic"), envs.StaticDataset(path))
  key = jax.random.key(0)
  epoch = source.candidates(key, 4) + source.candidates(key, 4)
  assert sorted(p.uid for p in epoch) == sorted(p.uid for p in problems)  # each once
  assert source.epoch == 1.0
  again = source.candidates(key, 8)
  assert sorted(p.uid for p in again) == sorted(p.uid for p in problems)
  # Resuming from the state continues the same order.
  other = prompts_lib.PromptSource(c, envs.get_env("arithmetic"), envs.StaticDataset(path))
  other.load_state_dict(json.loads(json.dumps({**source.state_dict(), "consumed": 8})))
  assert [p.uid for p in other.candidates(key, 8)] == [p.uid for p in again]


def test_dataset_run_resumes_in_order(tmp_path, monkeypatch, dataset):
  path, _ = dataset
  full, compiles = fx.run_counting_compiles(
    monkeypatch, tmp_path / "full", _dataset_config(path, 4)
  )
  assert compiles[2:] == [0, 0], compiles
  assert [r["data/epoch"] for r in full] == [0.5, 1.0, 1.5, 2.0]
  resumed = fx.resumed_run(tmp_path / "cut", lambda n: _dataset_config(path, n), 2, 4)
  fx.assert_same_records(full, resumed, "dataset")


def _curriculum_config(steps):
  c = fx.smoke_config(steps)
  c.env.update(name="tron:math", level=1)
  c.rl.curriculum.update(enabled=True, up=0.3, down=0.05, window=8, min_count=4)
  return c


def test_curriculum_moves_up_and_resumes(tmp_path):
  full = fx.run(tmp_path / "full", _curriculum_config(4))
  levels = [r["curriculum/mean_level"] for r in full]
  assert levels[-1] > 1.0, levels  # coin rewards (~0.5) exceed up=0.3: the envs move up
  assert all(b >= a for a, b in zip(levels, levels[1:]))
  assert {"curriculum/tron/sub/level", "curriculum/tron/mul/ema"} <= set(full[-1])
  resumed = fx.resumed_run(tmp_path / "cut", _curriculum_config, 2, 4)
  fx.assert_same_records(full, resumed, "curriculum")


def _dynamic_config(steps, **extra):
  c = fx.smoke_config(steps)
  c.rl.dynamic_sampling.update(enabled=True, max_rounds=3)
  c.rl.update(**extra)
  return c


def test_dynamic_sampling_refills_and_resumes(tmp_path, monkeypatch):
  full, compiles = fx.run_counting_compiles(monkeypatch, tmp_path / "full", _dynamic_config(4))
  assert compiles[2:] == [0, 0], compiles  # every round and the assembled batch keep one shape
  rows = 4 * 4  # P x G of the smoke config
  for r in full:
    assert 1 <= r["dynamic/rounds"] <= 3
    assert r["rollouts/generated"] == r["dynamic/rounds"] * rows
    assert r["dynamic/kept"] + r["dynamic/short"] == 4
    if r["dynamic/short"] == 0:  # a full batch of groups with a learning signal
      assert r["batch/zero_signal_groups"] == 0.0
    assert r["batch/zero_signal_groups"] == pytest.approx(r["dynamic/short"] / 4)
  assert max(r["dynamic/rounds"] for r in full) > 1  # a refill happened (fixed seed)
  resumed = fx.resumed_run(tmp_path / "cut", _dynamic_config, 2, 4)
  fx.assert_same_records(full, resumed, "dynamic")


def test_rollout_budget_stops_the_run(tmp_path):
  out = fx.run(tmp_path, _dynamic_config(10, max_rollouts=40))
  totals = [r["rollouts/total"] for r in out]
  assert totals[-1] >= 40 and (len(totals) == 1 or totals[-2] < 40)
  assert totals == [sum(r["rollouts/generated"] for r in out[: i + 1]) for i in range(len(out))]


def test_heldout_env_is_evaluated(tmp_path):
  c = fx.smoke_config(2)
  c.stages = ("rl", "eval")
  c.rl.eval_every = 2
  c.eval.update(heldout_env="tron/parity", heldout_level=1)
  out = fx.run(tmp_path, c)
  assert 0.0 <= out[-1]["eval/heldout_accuracy"] <= 1.0
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert 0.0 <= summary["accuracy_heldout_after_rl"] <= 1.0
  # The char tokenizer was built from a charset widened to the held-out env's characters.
  vocab = json.loads((tmp_path / "tokenizer" / "tokenizer.json").read_text())["model"]["vocab"]
  assert set(envs.ENVS["tron/parity"].chars) <= set(vocab)
  assert not set(envs.ENVS["tron/parity"].chars) <= set(envs.CORE_CHARSET)


def test_source_config_errors(tmp_path, dataset):
  c = fx.smoke_config(2)
  c.rl.curriculum.enabled = True
  with pytest.raises(ConfigError, match="mixed online env"):
    validate(c)
  c = fx.smoke_config(2)
  c.env.dataset = str(tmp_path / "nope.jsonl")
  with pytest.raises(ConfigError, match="does not exist"):
    validate(c)
  c = fx.smoke_config(2, "cero")
  c.rl.dynamic_sampling.enabled = True
  with pytest.raises(ConfigError, match="cannot be combined with scheduler 'cero'"):
    validate(c)
  c = fx.smoke_config(2)
  c.rl.max_rollouts = -1
  with pytest.raises(ConfigError, match="max_rollouts"):
    validate(c)
  c = fx.smoke_config(2)
  c.eval.heldout_env = "tron/nope"
  with pytest.raises(ConfigError, match="eval.heldout_env"):
    validate(c)
  c = _curriculum_config(2)
  c.env.dataset = dataset[0]
  with pytest.raises(ConfigError, match="cannot be combined"):
    validate(c)


def test_malformed_dataset_line_is_named(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text('{"prompt": "1+1=", "answer": "2", "env": "arithmetic"}\n{not json\n')
  c = _dataset_config(str(path), 2)
  with pytest.raises(ValueError, match="bad.jsonl:"):
    fx.run(tmp_path / "run", c)
