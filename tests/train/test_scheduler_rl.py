"""config.rl.scheduler in the RL loop: every scheduler name runs, and a run stopped after its
checkpoint and resumed produces the same schedule and metrics as an uninterrupted one."""

import importlib.util
import json
import math
import os
import shutil
import zlib

import numpy as np
import pytest

from posttrain_jax import envs
from posttrain_jax import scheduling
from posttrain_jax.sweeps import bench
from posttrain_jax.train import experiment
from posttrain_jax.train import rl as rl_lib
from posttrain_jax.train.validate import ConfigError, validate

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

KWARGS = {
    "cero": {"g_min": 2, "g_max": 8},
    "rollout_replay": {"tau_max": 2, "replay_count": 8},
    "group_replay": {"replay_count": 8},
    "review": {"rho": 0.5, "d_min": 1, "d_max": 4, "tau": 0.5},
    "uniform_review": {"rho": 0.25},
}


class _CoinEnv:
  """The smoke env with a reward a random model earns half of the time (a checksum of the
  completion's text), so groups have signal: advantages, replay, mastered prompts."""

  def __init__(self, env):
    self._env = env

  def __getattr__(self, name):
    return getattr(self._env, name)

  def verify(self, problem, completion):
    return float(zlib.crc32(f"{problem.uid}|{completion}".encode()) & 1)


@pytest.fixture(autouse=True)
def coin_env(monkeypatch):
  get_env = envs.get_env
  monkeypatch.setattr(envs, "get_env", lambda name: _CoinEnv(get_env(name)))


def _config(name, steps):
  """The smoke config of tests/train/test_rl_names.py: RL only, no evaluation."""
  spec = importlib.util.spec_from_file_location("qs", os.path.join(REPO, "experiments",
                                                                   "quickstart.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config("smoke")
  c.stages = ("rl",)
  c.progress = False
  c.rl.update(steps=steps, eval_every=0, checkpoint_every=2)
  c.rl.scheduler.name = name
  c.rl.scheduler.kwargs.update(KWARGS.get(name, {}))
  return c


def _records(workdir):
  with open(os.path.join(workdir, "rl", "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _run(workdir, name, steps):
  experiment.run(_config(name, steps), str(workdir))
  records = _records(workdir)
  assert [r["step"] for r in records] == list(range(1, steps + 1))
  for r in records:
    for k, v in r.items():
      assert not (isinstance(v, float) and math.isnan(v)), (k, r)
  return records


@pytest.mark.parametrize("name", ["cero", "rollout_replay", "review"])
def test_resumed_schedule_matches_uninterrupted(tmp_path, monkeypatch, name):
  counter, compiles, iteration = bench.CompileCounter(), [], rl_lib.rl_iteration

  def counted(*args, **kwargs):
    before = counter.count
    out = iteration(*args, **kwargs)
    compiles.append(counter.count - before)
    return out

  with monkeypatch.context() as m:
    m.setattr(rl_lib, "rl_iteration", counted)
    full = _run(tmp_path / "full", name, 4)
  assert compiles[2:] == [0, 0], compiles  # static row counts: the steady state compiles nothing
  _run(tmp_path / "cut", name, 2)
  assert os.path.exists(tmp_path / "cut" / "rl" / "scheduler" / "2.npz")
  # As if stopped right after step 2's checkpoint: no final parameters, not done.
  os.remove(tmp_path / "cut" / "rl" / "done.json")
  shutil.rmtree(tmp_path / "cut" / "rl" / "final")
  resumed = _run(tmp_path / "cut", name, 4)
  for a, b in zip(full, resumed):
    assert set(a) == set(b), set(a) ^ set(b)
    for k in a:
      if k.startswith("time/"):
        continue
      if isinstance(a[k], (int, float)):
        assert a[k] == pytest.approx(b[k], abs=1e-6, rel=1e-6), (name, a["step"], k, a[k], b[k])
      else:
        assert a[k] == b[k], (name, a["step"], k)
  last = full[-1]
  if name == "cero":
    assert "cero/lam" in last and "cero/tracked" in last
  elif name == "rollout_replay":  # the buffer fills and every later step replays M rows
    assert [r["replay/rows"] for r in full] == [0, 8, 8, 8]
    assert last["replay/age_mean"] >= 1
  else:
    assert sum(r["review/replaced"] for r in full) > 0


@pytest.mark.parametrize("name", ["uniform", "group_replay", "uniform_review"])
def test_every_other_scheduler_runs(tmp_path, name):
  _run(tmp_path, name, 2)


def test_every_scheduler_is_tested():
  tested = {"none", "cero", "rollout_replay", "review", "uniform", "group_replay",
            "uniform_review"}
  assert tested == set(scheduling.SCHEDULERS)


def test_config_errors():
  c = _config("nope", 2)
  with pytest.raises(ConfigError, match="valid names: cero, group_replay"):
    validate(c)
  c = _config("cero", 2)
  c.rl.scheduler.kwargs.bogus = 1
  with pytest.raises(ConfigError, match="bogus"):
    validate(c)
  c = _config("uniform", 2)
  c.rl.scheduler.kwargs.rho = 0.5
  with pytest.raises(ConfigError, match="rho"):
    validate(c)
  c = _config("rollout_replay", 2)
  c.rl.scheduler.kwargs.replay_count = 6  # 16 + 6 rows
  c.rl.minibatches = 4
  with pytest.raises(ConfigError, match="train rows"):
    validate(c)


def test_zero_signal_fraction_counts_real_groups_only():
  from posttrain_jax.train import rl as rl_lib
  rewards = np.array([1, 1, 0, 1, 0, 0, 5, 9], np.float32)
  group = np.array([0, 0, 1, 1, 2, 2, 3, 3])
  valid = np.array([1, 1, 1, 1, 1, 1, 1, 0], np.float32)  # group 3 has one real row: flat
  # groups: 0 flat, 1 mixed, 2 flat, 3 flat (its padding row's reward is ignored)
  assert rl_lib.zero_signal_fraction(rewards, group, valid) == 0.75
  assert rl_lib.zero_signal_fraction(rewards, group, np.zeros(8)) == 0.0
