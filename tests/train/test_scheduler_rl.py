"""config.rl.scheduler in the RL loop: every scheduler name runs, and a run stopped after its
checkpoint and resumed produces the same schedule and metrics as an uninterrupted one."""

import json
import os

import numpy as np
import pytest
import rl_fixtures as fx

from posttrain_jax import scheduling
from posttrain_jax.methods import validate
from posttrain_jax.train import generation
from posttrain_jax.train.validate import ConfigError

KWARGS = {
  "cero": {"g_min": 2, "g_max": 8},
  "rollout_replay": {"tau_max": 2, "replay_count": 8},
  "group_replay": {"replay_count": 8},
  "review": {"rho": 0.5, "d_min": 1, "d_max": 4, "tau": 0.5},
  "uniform_review": {"rho": 0.25},
}


pytestmark = pytest.mark.usefixtures("coin_env")  # tests/train/conftest.py


def _config(name, steps):
  return fx.smoke_config(steps, name, **KWARGS.get(name, {}))


def _run(workdir, name, steps):
  return fx.run(workdir, _config(name, steps))


@pytest.mark.parametrize("name", ["cero", "rollout_replay", "review"])
def test_resumed_schedule_matches_uninterrupted(tmp_path, monkeypatch, name):
  full, compiles = fx.run_counting_compiles(monkeypatch, tmp_path / "full", _config(name, 4))
  assert compiles[2:] == [0, 0], compiles  # static row counts: the steady state compiles nothing
  resumed = fx.resumed_run(tmp_path / "cut", lambda n: _config(name, n), 2, 4)
  assert os.path.exists(tmp_path / "cut" / "rl" / "scheduler" / "2.npz")
  fx.assert_same_records(full, resumed, name)
  last = full[-1]
  if name == "cero":
    assert "cero/lam" in last and "cero/tracked" in last
  elif name == "rollout_replay":  # the buffer fills and every later step replays M rows
    assert [r["replay/rows"] for r in full] == [0, 8, 8, 8]
    assert last["replay/age_mean"] >= 1
  else:
    assert sum(r["review/replaced"] for r in full) > 0
    # the visit events (repair-window input) survive the resume unchanged
    events = [
      fx.read_jsonl(d / "rl" / "review_events.jsonl") for d in (tmp_path / "full", tmp_path / "cut")
    ]
    assert events[0] and events[0] == events[1]
    assert {e["step"] for e in events[0]} == {0, 1, 2, 3}


def test_review_run_reports_the_repair_window(tmp_path):
  c = _config("review", 6)
  c.stages = ("rl", "eval")
  out = fx.run(tmp_path, c)
  summary = json.loads((tmp_path / "summary.json").read_text())
  events = fx.read_jsonl(tmp_path / "rl" / "review_events.jsonl")
  assert len(events) == sum(
    len({e["uid"] for e in events if e["step"] == s}) for s in range(len(out))
  )
  episodes = scheduling.restoration_episodes(events)
  assert summary["review_episodes"] == len(episodes) > 0
  assert 0.0 <= summary["review_regression_rate"] <= 1.0
  assert "review delay (steps)" in (tmp_path / "eval" / "repair_curve.md").read_text()


@pytest.mark.parametrize("name", ["uniform", "group_replay", "uniform_review"])
def test_every_other_scheduler_runs(tmp_path, name):
  _run(tmp_path, name, 2)


def test_every_scheduler_is_tested():
  tested = {"none", "cero", "rollout_replay", "review", "uniform", "group_replay", "uniform_review"}
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
  rewards = np.array([1, 1, 0, 1, 0, 0, 5, 9], np.float32)
  group = np.array([0, 0, 1, 1, 2, 2, 3, 3])
  valid = np.array([1, 1, 1, 1, 1, 1, 1, 0], np.float32)  # group 3 has one real row: flat
  # groups: 0 flat, 1 mixed, 2 flat, 3 flat (its padding row's reward is ignored)
  assert generation.zero_signal_fraction(rewards, group, valid) == 0.75
  assert generation.zero_signal_fraction(rewards, group, np.zeros(8)) == 0.0
  # per rollout: 2 + 2 + 1 of the 7 real rollouts sit in flat groups
  assert generation.zero_signal_fraction(rewards, group, valid, per_rollout=True) == 5 / 7
