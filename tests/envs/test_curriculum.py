"""envs.curriculum: per-env level moves at thresholds, JSON state, purity, mix for MixedEnv."""

import json

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain_jax import envs
from posttrain_jax.envs import curriculum as cur

LEVELS = {"a": [1, 2, 3], "b": [1, 2, 3, 4]}


def _state(**kw):
  kw = {"up": 0.75, "down": 0.25, "window": 4, "min_count": 4, **kw}
  return cur.init(LEVELS, **kw)


def _feed(state, name, level, rewards):
  return cur.update(state, [(name, level, r) for r in rewards])


def test_moves_up_only_strictly_above_threshold():
  s = _feed(_state(), "a", 1, [1, 1, 1])  # 3 < min_count: no move even at rate 1
  assert cur.levels(s) == {"a": 1, "b": 1}
  s = _feed(s, "a", 1, [0])  # window [1,1,1,0] = 0.75 = up: no move
  assert cur.levels(s)["a"] == 1
  s = _feed(s, "a", 1, [1])  # [1,1,0,1] = 0.75: still no move
  assert cur.levels(s)["a"] == 1
  s = _feed(s, "a", 1, [1, 1])  # [0,1,1,1] = 0.75: still no move
  assert cur.levels(s)["a"] == 1
  s = _feed(s, "a", 1, [1])  # [1,1,1,1] = 1 > 0.75: up, window cleared
  assert cur.levels(s)["a"] == 2 and s["envs"]["a"]["window"] == []
  assert s["envs"]["a"]["moves_up"] == 1 and cur.levels(s)["b"] == 1


def test_moves_down_only_strictly_below_threshold():
  s = _state(start={"b": 3})
  s = _feed(s, "b", 3, [0, 0, 0, 1])  # 0.25 = down: no move
  assert cur.levels(s)["b"] == 3
  s = _feed(s, "b", 3, [0])  # [0,0,1,0] = 0.25: no move
  assert cur.levels(s)["b"] == 3
  s = _feed(s, "b", 3, [0])  # [0,1,0,0] = 0.25
  s = _feed(s, "b", 3, [0])  # [1,0,0,0] = 0.25
  assert cur.levels(s)["b"] == 3
  s = _feed(s, "b", 3, [0])  # [0,0,0,0] = 0 < 0.25: down
  assert cur.levels(s)["b"] == 2 and s["envs"]["b"]["moves_down"] == 1


def test_level_bounds_and_stale_outcomes():
  s = _state(start=3)
  assert cur.levels(s) == {"a": 3, "b": 3}
  s = _feed(s, "a", 3, [1] * 8)  # already at the top of "a"
  assert cur.levels(s)["a"] == 3
  s = _state()
  s = _feed(s, "a", 1, [0] * 8)  # already at the bottom
  assert cur.levels(s)["a"] == 1
  s = _feed(s, "a", 2, [1] * 8)  # stale/other-level outcomes: EMA only
  assert cur.levels(s)["a"] == 1 and s["envs"]["a"]["window"] == [0.0] * 4
  assert cur.pass_rate(s, "a", 2) == pytest.approx(1.0)
  assert cur.pass_rate(s, "a") == pytest.approx(0.0)
  assert cur.pass_rate(s, "b") is None


def test_ema_and_reward_clipping():
  s = cur.init(LEVELS, ema_decay=0.5, window=8, min_count=8)
  s = _feed(s, "a", 1, [1, 0, 2.5])
  assert cur.pass_rate(s, "a") == pytest.approx(0.5 * (0.5 * 1 + 0.5 * 0) + 0.5 * 1.0)
  assert s["envs"]["a"]["window"] == [1.0, 0.0, 1.0]
  with pytest.raises(ValueError, match="non-finite"):
    _feed(s, "a", 1, [float("nan")])
  with pytest.raises(ValueError, match="no env 'c'"):
    _feed(s, "c", 1, [1])


def test_state_round_trips_through_json_and_update_is_pure():
  s = _state(weighting="learnability", review=0.2)
  s = _feed(s, "a", 1, [1, 1, 1, 1, 0, 1])
  s = _feed(s, "b", 1, [0.5, 1])
  frozen = json.dumps(s, sort_keys=True)
  loaded = cur.check_state(json.loads(frozen))
  assert loaded == s
  outcomes = [("a", 2, 1), ("b", 1, 0), ("b", 1, 1), ("a", 2, 1), ("a", 2, 1), ("a", 2, 1)]
  after = cur.update(s, outcomes)
  assert json.dumps(s, sort_keys=True) == frozen  # input not mutated
  assert cur.update(loaded, outcomes) == after  # same result after a reload
  assert cur.update(s, outcomes) == after  # deterministic
  assert cur.mix(loaded) == cur.mix(s)
  assert after["updates"] == s["updates"] + 1


def test_check_state_rejects_garbage():
  with pytest.raises(ValueError, match="not a curriculum state"):
    cur.check_state({"version": 99})
  bad = _state()
  bad["envs"]["a"]["level"] = 7
  with pytest.raises(ValueError, match="outside its levels"):
    cur.check_state(bad)


@pytest.mark.parametrize(
  "kw,match",
  [
    ({"up": 0.2, "down": 0.5}, "down < up"),
    ({"window": 2, "min_count": 3}, "min_count"),
    ({"weighting": "magic"}, "weighting"),
    ({"review": 1.0}, "review"),
    ({"base_weights": {"zz": 1.0}}, "unknown envs"),
    ({"start": 9}, None),
  ],
)
def test_init_validates(kw, match):
  if match is None:  # an out-of-range start is clipped into each env's levels
    assert cur.levels(cur.init(LEVELS, **kw)) == {"a": 3, "b": 4}
    return
  with pytest.raises(ValueError, match=match):
    cur.init(LEVELS, **kw)


def test_mix_weights():
  s = cur.init(LEVELS, start={"b": 2}, review=0.25, base_weights={"a": 3.0})
  mix = cur.mix(s)
  assert sum(w for _, _, w in mix) == pytest.approx(1.0)
  assert mix == [
    ("a", 1, pytest.approx(0.75)),
    ("b", 1, pytest.approx(0.0625)),
    ("b", 2, pytest.approx(0.1875)),
  ]
  s = cur.init(LEVELS, weighting="learnability", min_weight=0.01, window=100, min_count=100)
  s = _feed(s, "a", 1, [1] * 60)  # solved: weight floors at 0.01
  w = dict(((n, l), w) for n, l, w in cur.mix(s))
  assert w[("b", 1)] / w[("a", 1)] == pytest.approx(0.25 / 0.01, rel=1e-3)
  m = cur.metrics(s)
  assert m["curriculum/a/level"] == 1.0 and m["curriculum/a/window_rate"] == 1.0
  assert np.isnan(m["curriculum/b/ema"]) and m["curriculum/mean_level"] == 1.0


@settings(max_examples=60, deadline=None)
@given(
  st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 4), st.floats(0, 1)), max_size=60),
  st.integers(1, 6),
)
def test_levels_stay_in_bounds(outcomes, chunk):
  s = cur.init(LEVELS, window=5, min_count=2)
  for i in range(0, len(outcomes), chunk):
    s = cur.update(s, outcomes[i : i + chunk])
    for name, level in cur.levels(s).items():
      assert level in LEVELS[name]
  assert json.loads(json.dumps(s)) == s


def test_drives_the_online_mix_upward():
  """A policy that solves levels <= 3 and nothing harder: the curriculum settles at 3 or 4."""
  env = envs.ENVS["tron:logic"]
  s = cur.init(env.env_levels(), window=16, min_count=16)
  for step in range(40):
    problems = env.sample(jax.random.fold_in(jax.random.key(0), step), 64, mix=cur.mix(s))
    s = cur.update(s, [(p.env, p.level, float(p.level <= 3)) for p in problems])
  assert all(level in (3, 4) for level in cur.levels(s).values()), cur.levels(s)
