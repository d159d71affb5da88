"""CERO: posterior value, utility, allocation properties, duals, layouts, state round trip."""

import json

import numpy as np
import pytest

from posttrain_jax.envs.base import Problem
from posttrain_jax.scheduling import Cero, cero, packed_layout, padded_layout


def _problems(n, level=0):
  return [
    Problem(prompt=f"q{i}", answer="a", env="toy", level=level, uid=f"u{i}") for i in range(n)
  ]


def _run(steps=120, pool=64, P=8, G=8, seed=0, budget_fn=None, **config):
  """A simulated run over a finite dataset; yields (state, allocation, budget, idx) per step."""
  rng = np.random.default_rng(seed)
  truth = rng.uniform(0, 1, pool) ** 2
  truth[:10], truth[10:20] = 0.0, 1.0
  problems = _problems(pool)
  state = cero.init(**config)
  for t in range(steps):
    idx = rng.choice(pool, P, replace=False)
    batch = [problems[i] for i in idx]
    budget = P * G if budget_fn is None else budget_fn(t)
    alloc = cero.allocate(state, batch, budget)
    yield state, alloc, budget, idx, truth
    n = alloc.group_sizes
    state = cero.update(
      state, batch, rng.binomial(n, truth[idx]), n, demand=alloc.demand, budget=budget
    )


def test_expected_variance_matches_monte_carlo_and_is_bounded():
  rng = np.random.default_rng(0)
  for a, b in [(1, 1), (3, 7), (20, 2), (0.5, 0.5)]:
    theta = rng.beta(a, b, 200_000)
    assert cero.expected_variance(a, b) == pytest.approx(np.mean(theta * (1 - theta)), abs=2e-3)
  a = np.linspace(0.1, 50, 300)
  grid_a, grid_b = np.meshgrid(a, a)
  v = cero.expected_variance(grid_a, grid_b)
  assert v.max() <= 0.25
  for total in (2.0, 10.0, 40.0):  # along a + b = const the maximum is at a = b
    xs = np.linspace(0.01, total - 0.01, 999)
    assert xs[np.argmax(cero.expected_variance(xs, total - xs))] == pytest.approx(
      total / 2, abs=0.05
    )


def test_utility_is_increasing_concave_and_saturating():
  n = np.arange(0, 200, dtype=float)
  u = cero.utility(n, 0.2, n_sat=16.0)
  d1 = np.diff(u)
  assert np.all(d1 > 0) and np.all(np.diff(d1) < 0)
  assert u[-1] < 0.2 * 16.0 and u[-1] == pytest.approx(0.2 * 16.0, rel=1e-3)


def test_budget_feasibility_bounds_and_dual_signs_every_step():
  budgets = lambda t: [16, 24, 64, 100, 200][t % 5]  # tight, loose and above P * g_max
  for state, alloc, budget, _, _ in _run(steps=150, budget_fn=budgets):
    n = alloc.group_sizes
    assert n.dtype == np.int32 and n.shape == (8,)
    assert n.sum() <= budget
    assert np.all(n >= 2) and np.all(n <= 16)
    assert state["lam"] >= 0.0
    vals = cero.prompt_values(state, list(state["prompts"]))
    assert np.all(vals["mu"] >= 0.0) and np.all(vals["mu"] <= vals["v"] + 1e-15)


def test_budget_below_minimum_raises():
  with pytest.raises(ValueError, match="below"):
    cero.allocate(cero.init(g_min=2), _problems(4), 7)


def test_long_run_spend_tracks_the_budget():
  spent = [alloc.group_sizes.sum() for _, alloc, *_ in _run(steps=200)]
  assert np.mean(spent[50:]) >= 0.9 * 64


def test_equal_values_give_a_uniform_allocation():
  state = cero.init(g_min=2, g_max=16)
  for budget in (16, 40, 64):  # demand at lam0 = 0.5 is 12 per prompt: the budget binds
    assert cero.allocate(state, _problems(8), budget).group_sizes.tolist() == [budget // 8] * 8
  assert cero.allocate(state, _problems(8), 128).group_sizes.tolist() == [12] * 8  # demand binds
  n = cero.allocate({**state, "lam": 0.0}, _problems(8), 61).group_sizes
  assert n.sum() == 61 and n.max() - n.min() <= 1
  n = cero.allocate({**state, "lam": 5.0}, _problems(8), 64).group_sizes  # price above all
  assert n.tolist() == [2] * 8


def test_zero_variance_prompts_get_fewer_rollouts():
  state = cero.init(g_min=2, g_max=16)
  easy, hard, unsure = [40.0, 1.0], [1.0, 40.0], [10.0, 10.0]
  for lam in (0.3, 0.6, 0.9, 0.0):
    st = dict(state, lam=lam, prompts={})
    for uid, (a, b) in zip(["e", "h", "u"], [easy, hard, unsure]):
      v = float(cero.expected_variance(a, b))
      st["prompts"][uid] = [a, b, 20.0, v * np.exp(-20.0 / 16.0)]
    n = cero.allocate(st, ["e", "h", "u"], 24).group_sizes
    assert n[2] > n[0] and n[2] > n[1], (lam, n)
  # and over a simulated run: prompts whose true rate is 0 or 1 average fewer than uncertain ones
  sums, counts = np.zeros(64), np.zeros(64)
  for _, alloc, _, idx, truth in _run(steps=150):
    sums[idx] += alloc.group_sizes
    counts[idx] += 1
  mean = sums / np.maximum(counts, 1)
  middle = (truth > 0.2) & (truth < 0.8)
  assert mean[:20].mean() < mean[middle].mean() - 1.0


def test_deterministic_and_json_round_trip():
  states = [s for s, *_ in _run(steps=30)]
  for state in states[::7]:
    again = json.loads(json.dumps(state))
    assert again == state
    batch = _problems(8)[::-1]
    a, b = cero.allocate(state, batch, 64), cero.allocate(again, batch, 64)
    assert a.group_sizes.tolist() == b.group_sizes.tolist() and a.demand == b.demand
  assert cero.check_state(json.loads(json.dumps(states[-1])))
  with pytest.raises(ValueError):
    cero.check_state({"version": 99})


def test_update_is_pure():
  state = cero.init()
  frozen = json.dumps(state)
  cero.update(state, _problems(2), [1.0, 0.0], [4, 4], demand=8, budget=8)
  assert json.dumps(state) == frozen


def test_level_prior_shifts_unseen_prompts():
  state = cero.init(level_prior=10.0)
  state = cero.update(state, _problems(4, level=3), [0.0] * 4, [8] * 4, demand=32, budget=32)
  fresh = Problem(prompt="new", answer="a", env="toy", level=3, uid="new")
  vals = cero.prompt_values(state, [fresh])
  assert vals["a"][0] < vals["b"][0]  # the level never succeeded: prior mean below 1/2


def _padded_reference(sizes, g_max):
  group, valid = [], []
  for p, n in enumerate(sizes):
    for j in range(g_max):
      group.append(p)
      valid.append(1.0 if j < n else 0.0)
  return np.array(group, np.int32), np.array(valid, np.float32)


def test_layouts_match_numpy_loop_references():
  rng = np.random.default_rng(1)
  for _ in range(20):
    sizes = rng.integers(0, 9, size=rng.integers(1, 7))
    group, valid = padded_layout(sizes, 8)
    ref_group, ref_valid = _padded_reference(sizes, 8)
    np.testing.assert_array_equal(group, ref_group)
    np.testing.assert_array_equal(valid, ref_valid)
    assert group.dtype == np.int32 and valid.dtype == np.float32
    rows = int(sizes.sum()) + 3
    group, valid = packed_layout(sizes, rows)
    ref = [p for p, n in enumerate(sizes) for _ in range(n)]
    np.testing.assert_array_equal(group[: len(ref)], ref)
    np.testing.assert_array_equal(valid, [1.0] * len(ref) + [0.0] * (rows - len(ref)))
    np.testing.assert_array_equal(np.bincount(group, weights=valid, minlength=len(sizes)), sizes)
  with pytest.raises(ValueError):
    padded_layout([3, 9], 8)


def _simulate(sched, steps, rng, truth, problems, start=0):
  out = []
  for t in range(start, start + steps):
    batch = [problems[i] for i in rng.choice(len(problems), 6, replace=False)]
    sel = sched.select(t, batch, None)
    uids = np.array([int(p.uid[1:]) for p in sel.problems])
    rewards = (rng.uniform(size=sel.rows) < truth[uids[sel.group]]).astype(np.float32)
    out.append((sel.group_sizes.tolist(), sel.valid.sum()))
    sched.observe(t, sel.problems, rewards, sel.group, sel.valid)
  return out


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_scheduler_layout_and_resume(layout):
  problems, truth = _problems(30), np.linspace(0, 1, 30)
  sched = Cero(group_size=4, layout=layout, g_min=2, g_max=8)
  sel = sched.select(0, problems[:6], None)
  assert sel.rows == (6 * 8 if layout == "padded" else 6 * 4)
  np.testing.assert_array_equal(
    np.bincount(sel.group, weights=sel.valid, minlength=6), sel.group_sizes
  )
  sched = Cero(group_size=4, layout=layout, g_min=2, g_max=8)
  _simulate(sched, 10, np.random.default_rng(0), truth, problems)
  saved = json.loads(json.dumps(sched.state_dict()))
  rest = Cero(group_size=4, layout=layout, g_min=2, g_max=8)
  rest.load_state_dict(saved)
  a = _simulate(sched, 10, np.random.default_rng(5), truth, problems, start=10)
  b = _simulate(rest, 10, np.random.default_rng(5), truth, problems, start=10)
  assert a == b
  with pytest.raises(ValueError, match="preceding select"):
    sched.observe(0, problems[:6], np.zeros(48), sel.group, sel.valid)
