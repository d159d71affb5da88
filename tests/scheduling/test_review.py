"""Retention-aware review: turnover set algebra, zero extra rollouts, replacement rules,
determinism, state round trip, and the repair-window measurement."""

import json

import numpy as np
import pytest

from posttrain_jax.envs.base import Problem
from posttrain_jax.scheduling import Review, Uniform, review


def _problem(i):
  return Problem(
    prompt=f"q{i}", answer=str(i), env="toy", level=i % 3, uid=f"u{i}", data=((i, i + 1), "x")
  )


POOL = [_problem(i) for i in range(40)]


def _history(mode="review", steps=30, seed=0, **config):
  """A review state after ``steps`` visits of 8 random prompts; prompt i is right w.p. i/40."""
  rng = np.random.default_rng(seed)
  state = review.init(mode=mode, **config)
  events = []
  for t in range(steps):
    idx = rng.choice(len(POOL), 8, replace=False)
    succ = (rng.uniform(size=8) < idx / 40.0) * 4.0
    state, ev, _ = review.observe(state, t, [POOL[i] for i in idx], succ, np.full(8, 4.0))
    events += ev
  return state, events


def test_turnover_set_algebra():
  rng = np.random.default_rng(0)
  for _ in range(200):
    before = {f"u{i}" for i in np.nonzero(rng.uniform(size=30) < 0.4)[0]}
    now = {f"u{i}" for i in np.nonzero(rng.uniform(size=30) < 0.4)[0]}
    t = review.turnover(before, now)
    assert t.acquired | t.retained == now and t.regressed | t.retained == before
    assert not (t.acquired & t.retained or t.regressed & t.retained or t.acquired & t.regressed)
    assert len(now) == len(before) + len(t.acquired) - len(t.regressed)


def test_epoch_turnover_counts_match_the_correct_sets():
  state, _ = _history(steps=10)
  before = review.correct_set(state)
  state, _ = review.close_epoch(state, 10)
  rng = np.random.default_rng(1)
  for t in range(10, 20):
    idx = rng.choice(len(POOL), 8, replace=False)
    state, _, _ = review.observe(
      state, t, [POOL[i] for i in idx], rng.integers(0, 5, 8), np.full(8, 4)
    )
  now = review.correct_set(state)
  state, m = review.close_epoch(state, 20)
  assert m["turnover/acquired"] == len(now - before)
  assert m["turnover/regressed"] == len(before - now)
  assert m["turnover/retained"] == len(before & now)
  assert m["turnover/correct"] == len(now) and state["snapshot"] == sorted(now)
  assert review.mastered_set(state) >= now


@pytest.mark.parametrize("mode", ["review", "uniform"])
def test_batch_size_and_rollouts_unchanged(mode):
  state, _ = _history(mode=mode, rho=0.5)
  sched = Review(group_size=4, mode=mode, rho=0.5)
  sched.state = state
  batch = POOL[:8]
  sel = sched.select(30, batch, np.random.default_rng(0))
  ref = Uniform(group_size=4).select(30, batch, None)
  assert len(sel.problems) == 8 and sel.rows == ref.rows
  np.testing.assert_array_equal(sel.group_sizes, ref.group_sizes)
  np.testing.assert_array_equal(sel.group, ref.group)
  np.testing.assert_array_equal(sel.valid, ref.valid)
  assert sel.metrics["review/replaced"] > 0
  assert len({p.uid for p in sel.problems}) == 8  # no duplicates introduced


def test_replaced_prompts_are_mastered_and_inside_the_window():
  replaced = 0
  for seed in range(5):
    state, _ = _history(steps=30, seed=seed, rho=0.5, d_min=2, d_max=6)
    batch = POOL[30:38]
    out, pos, m = review.replace(state, 30, batch, np.random.default_rng(seed))
    assert len(out) == 8 and m["review/replaced"] == len(pos) <= 4
    replaced += len(pos)
    mastered = review.mastered_set(state)
    for i in range(8):
      if i in pos:
        e = state["prompts"][out[i].uid]
        assert out[i].uid in mastered and 2 <= 30 - e[review.SUCCESS] <= 6
        assert out[i] == POOL[int(out[i].uid[1:])]  # the stored record is the same Problem
      else:
        assert out[i] is batch[i]
  assert replaced >= 10


def test_regressed_prompts_come_first():
  state = review.init(rho=0.25, d_min=1, d_max=10)
  a, b, c = POOL[0], POOL[1], POOL[2]
  state, _, _ = review.observe(state, 0, [a, b, c], [4, 4, 4], [4, 4, 4])
  state, _, _ = review.observe(state, 1, [b], [0], [4])  # b regressed
  order = review.review_candidates(state, 5)
  assert order[0] == "u1" and set(order) == {"u0", "u1", "u2"}
  out, pos, _ = review.replace(state, 5, POOL[10:14], np.random.default_rng(0))
  assert [out[i].uid for i in pos] == ["u1"]
  assert review.review_candidates(state, 5, exclude={"u1"}) != []
  assert review.review_candidates(state, 20) == []  # outside the window


def test_rho_zero_leaves_the_batch_unchanged():
  state, _ = _history(rho=0.0)
  batch = POOL[:8]
  out, pos, _ = review.replace(state, 30, batch, np.random.default_rng(0))
  assert out == batch and len(pos) == 0


def test_uniform_mode_draws_past_prompts_outside_the_batch():
  state, _ = _history(mode="uniform", rho=0.5, pool_size=12)
  assert len(state["pool"]) == 12 and set(state["records"]) == set(state["pool"])
  batch = POOL[:8]
  out, pos, _ = review.replace(state, 30, batch, np.random.default_rng(0))
  in_batch = {p.uid for p in batch}
  for i in pos:
    assert out[i].uid in state["pool"] and out[i].uid not in in_batch


@pytest.mark.parametrize("mode", ["review", "uniform"])
def test_deterministic_and_state_round_trip(mode):
  state, _ = _history(mode=mode, rho=0.5)
  again = json.loads(json.dumps(state))
  assert review.check_state(again) == state
  for seed in range(3):
    x = review.replace(state, 31, POOL[:8], np.random.default_rng(seed))
    y = review.replace(again, 31, POOL[:8], np.random.default_rng(seed))
    assert x[0] == y[0] and x[1].tolist() == y[1].tolist()
  frozen = json.dumps(state)
  review.observe(state, 31, POOL[:2], [4, 0], [4, 4])
  review.replace(state, 31, POOL[:8], np.random.default_rng(0))
  assert json.dumps(state) == frozen  # pure


def _drive(sched, steps, start, seed):
  rng, out = np.random.default_rng(seed), []
  for t in range(start, start + steps):
    batch = [POOL[i] for i in rng.choice(len(POOL), 8, replace=False)]
    sel = sched.select(t, batch, np.random.default_rng([seed, t]))
    truth = np.array([int(p.uid[1:]) / 40 for p in sel.problems])[sel.group]
    rewards = (rng.uniform(size=sel.rows) < truth).astype(np.float32)
    out.append(
      ([p.uid for p in sel.problems], sched.observe(t, sel.problems, rewards, sel.group, sel.valid))
    )
  return out


@pytest.mark.parametrize("mode", ["review", "uniform"])
def test_scheduler_resume_and_epochs(mode):
  sched = Review(group_size=4, mode=mode, rho=0.25, epoch_steps=5, tau=0.75)
  _drive(sched, 12, 0, 0)
  assert sched.state["epoch"] == 2 and sched.last_events
  saved = json.loads(json.dumps(sched.state_dict()))
  rest = Review(group_size=4, mode=mode, rho=0.25, epoch_steps=5, tau=0.75)
  rest.load_state_dict(saved)
  a, b = _drive(sched, 10, 12, 3), _drive(rest, 10, 12, 3)
  assert json.dumps(a) == json.dumps(b)
  assert any("turnover/retention" in m for _, m in a)


def test_restoration_episodes_and_repair_curve():
  ev = lambda step, ok, n=4, uid="a": {"step": step, "uid": uid, "correct": ok, "rollouts": n}
  events = [
    ev(0, True),
    ev(2, True),
    ev(7, False),
    ev(9, False, 8),
    ev(12, True),
    ev(20, False),
    ev(1, False, uid="b"),
    ev(3, True, uid="b"),
    ev(5, False, uid="b"),
  ]
  eps = review.restoration_episodes(events)
  assert eps == [
    {
      "uid": "a",
      "success_step": 0,
      "delay": 2,
      "regressed": False,
      "restored": True,
      "visits": 0,
      "steps": 0,
      "rollouts": 0,
    },
    {
      "uid": "a",
      "success_step": 2,
      "delay": 5,
      "regressed": True,
      "restored": True,
      "visits": 3,
      "steps": 5,
      "rollouts": 16,
    },
    {
      "uid": "a",
      "success_step": 12,
      "delay": 8,
      "regressed": True,
      "restored": False,
      "visits": 1,
      "steps": 0,
      "rollouts": 4,
    },
    {
      "uid": "b",
      "success_step": 3,
      "delay": 2,
      "regressed": True,
      "restored": False,
      "visits": 1,
      "steps": 0,
      "rollouts": 4,
    },
  ]
  curve = review.repair_curve(eps, [0, 4, 10])
  assert curve[0]["episodes"] == 2 and curve[0]["regression_rate"] == 0.5
  assert curve[0]["restored"] == 0 and np.isnan(curve[0]["mean_visits"])
  assert curve[1]["episodes"] == 2 and curve[1]["restored"] == 1
  assert curve[1]["mean_visits"] == 3 and curve[1]["mean_rollouts"] == 16


def test_events_from_observe_feed_the_measurement():
  _, events = _history(steps=40, seed=2)
  eps = review.restoration_episodes(events)
  assert eps and all(e["delay"] >= 1 for e in eps)
  assert all(e["visits"] >= 1 for e in eps if e["regressed"])
