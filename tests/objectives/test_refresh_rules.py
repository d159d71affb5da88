"""Teacher refresh rules (objectives/refresh_rules.py): ``never``, ``every`` (snapshot and TRL's
mixup), ``ema`` and CGTR's consolidation gate (methods_A.md section 9 (d)), their JSON state
across a resume, their config errors, and :func:`blend`, the parameter update a mix stands for."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posttrain_jax import registry
from posttrain_jax.objectives import refresh_rules as tr


def _run(name, stats_seq, kwargs=None, state=None, first_step=1):
  """Feeds ``stats_seq`` to rule ``name`` from ``first_step``; (mixes, metrics, final state)."""
  kwargs = kwargs or {}
  state = tr.init_state(name, **kwargs) if state is None else state
  mixes, metrics = [], []
  for i, stats in enumerate(stats_seq):
    mix, state, m = tr.REFRESH_RULES[name](state, stats, first_step + i, **kwargs)
    mixes.append(mix)
    metrics.append(m)
  return mixes, metrics, state


def _stats(reward, len95, trunc, kl=None):
  out = [
    {"reward/mean": float(r), "gen/len_p95": float(q), "gen/truncated": float(t)}
    for r, q, t in zip(reward, len95, trunc)
  ]
  if kl is not None:
    for s, k in zip(out, kl):
      s["teacher/kl"] = float(k)
  return out


def _random_stats(rng, n):
  """A run whose reward drifts up with noise, whose length tail wanders and spikes and whose
  truncation rate sometimes passes 5%: every gate condition is met and violated somewhere."""
  reward = np.clip(np.cumsum(rng.normal(0.01, 0.03, n)) + 0.2, 0, 1)
  len95 = np.maximum(2.0, 20 + np.cumsum(rng.normal(0.0, 1.0, n)))
  spikes = rng.random(n) < 0.15
  len95 = np.where(spikes, len95 * rng.uniform(1.2, 2.0, n), len95)
  trunc = np.where(rng.random(n) < 0.2, rng.uniform(0.0, 0.3, n), rng.uniform(0.0, 0.03, n))
  return _stats(reward, len95, trunc, kl=rng.uniform(0, 1, n))


def _reference_gate(stats_seq, *, window, min_isolation, delta_r, delta_l, max_truncation):
  """The gate written out as a plain loop over numpy arrays (an independent implementation):
  per step (refresh?, length condition held?, isolation held?, reward condition held?)."""
  r = np.array([s["reward/mean"] for s in stats_seq])
  q = np.array([s["gen/len_p95"] for s in stats_seq])
  tau = np.array([s["gen/truncated"] for s in stats_seq])
  c = 1.0 - 1.0 / window
  er, eq, et = np.zeros_like(r), np.zeros_like(q), np.zeros_like(tau)
  er[0], eq[0], et[0] = r[0], q[0], tau[0]
  for i in range(1, len(r)):
    er[i] = c * er[i - 1] + r[i] / window
    eq[i] = c * eq[i - 1] + q[i] / window
    et[i] = c * et[i - 1] + tau[i] / window
  last, r_ref, q_ref, out = 0, er[0], eq[0], []
  for i in range(len(r)):
    step = i + 1
    iso = step - last >= min_isolation
    rew = er[i] >= r_ref + delta_r
    length = eq[i] <= (1 + delta_l) * q_ref and et[i] <= max_truncation
    fire = iso and rew and length
    if fire:
      last, r_ref, q_ref = step, er[i], eq[i]
    out.append((fire, length, iso, rew))
  return out


CGTR = {
  "window": 10.0,
  "min_isolation": 10,
  "delta_r": 0.01,
  "delta_l": 0.1,
  "max_truncation": 0.05,
}


# ---------------------------------------------------------------- never, every, ema


def test_never_never_moves_the_teacher():
  mixes, metrics, state = _run("never", [{}] * 40)
  assert mixes == [0.0] * 40 and state["refreshes"] == 0
  assert [m["teacher/steps_since_refresh"] for m in metrics] == list(range(1, 41))
  assert all(m["teacher/refreshed"] == 0.0 and m["teacher/refreshes"] == 0.0 for m in metrics)


@pytest.mark.parametrize("period,alpha", [(1, 1.0), (4, 1.0), (7, 0.6)])
def test_every_fires_exactly_at_multiples_of_the_period(period, alpha):
  mixes, metrics, state = _run("every", [{}] * 30, {"period": period, "alpha": alpha})
  fired = [step for step, mix in enumerate(mixes, start=1) if mix > 0]
  assert fired == list(range(period, 31, period))
  assert all(mixes[s - 1] == alpha for s in fired)
  assert state["refreshes"] == 30 // period
  assert [m["teacher/refreshed"] for m in metrics] == [float(m > 0) for m in mixes]
  assert metrics[-1]["teacher/refreshes"] == 30 // period
  if period > 1:  # updates since the last refresh, counted before the step's decision
    assert metrics[period]["teacher/steps_since_refresh"] == 1.0
    assert metrics[period - 1]["teacher/steps_since_refresh"] == period


def test_every_with_alpha_below_one_is_trl_sync_ref_model():
  """TRL: ``π_ref = α π_θ + (1 - α) π_ref_prev`` at every ``ref_model_sync_steps``-th step."""
  alpha, period = 0.6, 3
  teacher, want = jnp.full((3,), 5.0), 5.0
  state = tr.init_state("every", period=period, alpha=alpha)
  for step in range(1, 10):
    mix, state, _ = tr.every(state, {}, step, period=period, alpha=alpha)
    teacher = tr.blend(teacher, jnp.full((3,), float(step)), mix)  # the student moves
    if step % period == 0:
      want = alpha * step + (1 - alpha) * want
    np.testing.assert_allclose(np.asarray(teacher), want, rtol=1e-6)
  assert state["refreshes"] == 3


def test_ema_mix_and_its_closed_form():
  """θ_T <- α θ_T + (1 - α) θ_S iterated n times toward a fixed student is
  α^n θ_0 + (1 - α^n) θ_S."""
  alpha = 0.9
  mixes, metrics, state = _run("ema", [{}] * 25, {"alpha": alpha})
  assert mixes == [pytest.approx(1 - alpha, abs=1e-15)] * 25 and state["refreshes"] == 25
  assert all(m["teacher/refreshed"] == 1.0 for m in metrics)
  rng = np.random.default_rng(0)
  t0 = rng.normal(size=(4, 3)).astype(np.float32)
  s = rng.normal(size=(4, 3)).astype(np.float32)
  teacher = {"w": jnp.asarray(t0)}
  for n, mix in enumerate(mixes, start=1):
    teacher = tr.blend(teacher, {"w": jnp.asarray(s)}, mix)
    want = alpha**n * t0.astype(np.float64) + (1 - alpha**n) * s
    np.testing.assert_allclose(np.asarray(teacher["w"]), want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- blend


def test_blend_zero_is_the_teacher_itself_and_one_is_an_unaliased_copy():
  teacher = {"a": jnp.arange(4.0), "b": {"c": jnp.ones((2, 2), jnp.bfloat16)}}
  student = {"a": jnp.arange(4.0) + 1, "b": {"c": jnp.full((2, 2), 3.0, jnp.bfloat16)}}
  assert tr.blend(teacher, student, 0.0) is teacher  # untouched: bit-identical
  copy = tr.blend(teacher, student, 1.0)
  for got, want in zip(jax.tree.leaves(copy), jax.tree.leaves(student)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert got is not want and got.unsafe_buffer_pointer() != want.unsafe_buffer_pointer()
  half = tr.blend(teacher, student, 0.5)
  assert half["b"]["c"].dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(half["a"]), np.arange(4.0) + 0.5)
  np.testing.assert_array_equal(np.asarray(half["b"]["c"], np.float32), 2.0)


def test_blend_refuses_a_teacher_of_another_shape():
  with pytest.raises(registry.ConfigError, match="rule 'never'"):
    tr.blend({"w": jnp.zeros((2, 3))}, {"w": jnp.zeros((2, 4))}, 1.0)
  with pytest.raises(registry.ConfigError, match="structure"):
    tr.blend({"w": jnp.zeros(2)}, {"v": jnp.zeros(2)}, 0.5)
  with pytest.raises(ValueError, match="mix must lie"):
    tr.blend({"w": jnp.zeros(2)}, {"w": jnp.zeros(2)}, 1.5)


def test_teacher_bit_identical_between_refreshes():
  """Driving blend with the rule's mixes: between two refreshes the teacher's bytes do not
  change however the student moves; at a refresh they become the student's."""
  teacher = {"w": jnp.asarray(np.random.default_rng(1).normal(size=(8,)), jnp.float32)}
  state = tr.init_state("every", period=5)
  for step in range(1, 16):
    student = {"w": teacher["w"] + 0.001 * step}
    before = np.asarray(teacher["w"]).tobytes()
    mix, state, _ = tr.every(state, {}, step, period=5)
    teacher = tr.blend(teacher, student, mix)
    if step % 5:
      assert np.asarray(teacher["w"]).tobytes() == before
    else:
      assert np.asarray(teacher["w"]).tobytes() == np.asarray(student["w"]).tobytes()


# ---------------------------------------------------------------- CGTR's gate


def test_cgtr_matches_a_reference_and_never_fires_with_the_length_tail_violated():
  """Over many random runs: the rule's decisions equal an independent loop's; whenever it
  refreshes, the length-tail and truncation conditions held (and M_min and the reward rise);
  and the length condition did block refreshes the other two allowed (the property is not
  vacuous)."""
  rng = np.random.default_rng(2026)
  refreshes = blocked_by_length = 0
  for run in range(60):
    kwargs = dict(
      CGTR, window=float(rng.choice([1.0, 3.0, 10.0])), min_isolation=int(rng.integers(1, 12))
    )
    seq = _random_stats(rng, 120)
    mixes, metrics, _ = _run("cgtr", seq, kwargs)
    ref = _reference_gate(seq, **kwargs)
    assert [m > 0 for m in mixes] == [r[0] for r in ref], run
    last = 0
    for i, (mix, m, (_, length, iso, rew)) in enumerate(zip(mixes, metrics, ref)):
      step = i + 1
      assert m["teacher/gate_length"] == float(length)
      assert m["teacher/gate_isolation"] == float(iso)
      assert m["teacher/gate_reward"] == float(rew)
      blocked_by_length += iso and rew and not length
      if mix > 0:
        refreshes += 1
        assert mix == 1.0 and length and m["teacher/truncation_ema"] <= CGTR["max_truncation"]
        assert step - last >= kwargs["min_isolation"]
        assert m["teacher/refresh_shock"] == seq[i]["teacher/kl"]
        last = step
      else:
        assert "teacher/refresh_shock" not in m
  assert refreshes > 50 and blocked_by_length > 50


def test_cgtr_refresh_steps_on_a_known_run():
  """W = 1 (no smoothing), reward rising 0.01 per step, M_min = 10: refreshes at 10, 20; the
  length tail jumps 50% over steps 25-34 so none until it is back at step 35; truncation above
  τ_trunc at steps 45-54 holds the next one (due at 45) to step 55."""
  n = 60
  steps = np.arange(1, n + 1)
  reward = 0.01 * steps
  len95 = np.where((steps >= 25) & (steps < 35), 30.0, 20.0)
  trunc = np.where((steps >= 45) & (steps < 55), 0.2, 0.0)
  kwargs = dict(CGTR, window=1.0, delta_r=0.005)
  mixes, metrics, state = _run("cgtr", _stats(reward, len95, trunc, kl=steps * 0.1), kwargs)
  fired = [int(s) for s, m in zip(steps, mixes) if m > 0]
  assert fired == [10, 20, 35, 55]
  assert state["refreshes"] == 4 and metrics[-1]["teacher/refreshes"] == 4.0
  assert metrics[34]["teacher/refresh_shock"] == pytest.approx(3.5)
  assert metrics[29]["teacher/gate_length"] == 0.0 and metrics[29]["teacher/gate_reward"] == 1.0
  assert metrics[49]["teacher/gate_length"] == 0.0
  assert metrics[49]["teacher/steps_since_refresh"] == 15.0


def test_cgtr_waits_for_a_reward_rise_of_delta_r():
  """A flat reward never refreshes however long the isolation; a rise of just under δ_R over
  the start does not either, one of δ_R does (first stats = the values at the 'last refresh')."""
  flat = _stats(np.full(100, 0.5), np.full(100, 20.0), np.zeros(100))
  mixes, metrics, _ = _run("cgtr", flat, CGTR)
  assert max(mixes) == 0.0 and metrics[-1]["teacher/steps_since_refresh"] == 100
  assert all(m["teacher/gate_reward"] == 0.0 for m in metrics)
  for rise, fires in ((0.0099, False), (0.0101, True)):
    reward = np.where(np.arange(30) < 5, 0.5, 0.5 + rise)
    mixes, _, _ = _run(
      "cgtr", _stats(reward, np.full(30, 20.0), np.zeros(30)), dict(CGTR, window=1.0)
    )
    assert (max(mixes) > 0) == fires
    if fires:
      assert mixes.index(1.0) == 9  # step 10: M_min


def test_cgtr_ema_window():
  mixes, metrics, _ = _run(
    "cgtr", _stats([0.0, 1.0, 1.0], [10, 20, 20], [0, 0.5, 0]), dict(CGTR, window=4.0)
  )
  assert [m["teacher/reward_ema"] for m in metrics] == [0.0, 0.25, 0.4375]
  assert [m["teacher/len_p95_ema"] for m in metrics] == [10.0, 12.5, 14.375]
  assert [m["teacher/truncation_ema"] for m in metrics] == [0.0, 0.125, 0.09375]


def test_cgtr_names_a_missing_statistic():
  with pytest.raises(KeyError, match="gen/len_p95"):
    _run("cgtr", [{"reward/mean": 0.1, "gen/truncated": 0.0}], CGTR)
  with pytest.raises(ValueError, match="non-finite"):
    _run("cgtr", _stats([float("nan")], [1.0], [0.0]), CGTR)


# ---------------------------------------------------------------- resume and config


@pytest.mark.parametrize(
  "name,kwargs",
  [
    ("never", {}),
    ("every", {"period": 7, "alpha": 0.5}),
    ("ema", {"alpha": 0.95}),
    ("cgtr", dict(CGTR)),
  ],
)
def test_json_round_trip_mid_run_makes_the_same_decisions(name, kwargs):
  seq = _random_stats(np.random.default_rng(7), 80)
  mixes, metrics, final = _run(name, seq, kwargs)
  m1, r1, state = _run(name, seq[:37], kwargs)
  state = json.loads(json.dumps(state))  # what the checkpoint meta stores
  m2, r2, final2 = _run(name, seq[37:], kwargs, state=state, first_step=38)
  assert m1 + m2 == mixes and r1 + r2 == metrics and final2 == final
  if name != "never":
    assert final["refreshes"] > 0


def test_unknown_rule_lists_the_valid_names():
  with pytest.raises(registry.ConfigError, match="cgtr, ema, every, never"):
    tr.check("sometimes", {})
  with pytest.raises(registry.ConfigError, match="unknown teacher rule"):
    tr.init_state("emma")


@pytest.mark.parametrize(
  "name,kwargs,match",
  [
    ("never", {"period": 3}, r"unknown argument\(s\) \['period'\].*no arguments"),
    ("every", {"periods": 3}, r"rule_kwargs has unknown argument\(s\) \['periods'\].*period"),
    ("every", {"period": 0}, r"rule_kwargs\.period=0 must be an integer >= 1"),
    ("every", {"period": 2.5}, r"rule_kwargs\.period=2.5 must be an integer"),
    ("every", {"alpha": 0.0}, r"rule_kwargs\.alpha=0.0 must be a number in \(0, 1\]"),
    ("ema", {"alpha": 1.0}, r"rule_kwargs\.alpha=1.0 must be a number in \[0, 1\)"),
    ("ema", {"alpha": True}, r"rule_kwargs\.alpha=True"),
    ("cgtr", {"window": 0.5}, r"rule_kwargs\.window=0.5 must be a number >= 1"),
    ("cgtr", {"min_isolation": 0}, r"rule_kwargs\.min_isolation=0"),
    ("cgtr", {"delta_r": float("inf")}, r"rule_kwargs\.delta_r=inf must be a finite"),
    ("cgtr", {"delta_l": -0.1}, r"rule_kwargs\.delta_l=-0.1 must be a number >= 0"),
    ("cgtr", {"max_truncation": 1.5}, r"rule_kwargs\.max_truncation=1.5 must be a number in"),
  ],
)
def test_bad_kwargs_name_the_config_key(name, kwargs, match):
  with pytest.raises(registry.ConfigError, match=match):
    tr.check(name, kwargs)
  with pytest.raises(registry.ConfigError, match=match):
    tr.init_state(name, **kwargs)


def test_every_kwarg_has_a_range_and_defaults_pass():
  for name in tr.REFRESH_RULES:
    assert set(tr.accepted(name)) == set(tr._RANGES.get(name, {}))
    tr.check(name, {})
    state = tr.init_state(name)
    assert json.loads(json.dumps(state)) == state
