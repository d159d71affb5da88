"""DPO, IPO, SimPO and KTO against numpy references, DPO's gradient in closed form, the
beta -> 0 and reference-free limits, IPO's minimiser, and jit equal to no jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posttrain_jax import objectives
from posttrain_jax.objectives import preference

RNG = np.random.default_rng(0)
B = 7
C, R = RNG.normal(-20, 4, B).astype(np.float32), RNG.normal(-22, 4, B).astype(np.float32)
RC, RR = RNG.normal(-21, 4, B).astype(np.float32), RNG.normal(-21, 4, B).astype(np.float32)
LC, LR = RNG.integers(3, 12, B).astype(np.float32), RNG.integers(3, 12, B).astype(np.float32)


def _logsig(x):
  return -np.log1p(np.exp(-x))


def _np_dpo(beta, eps=0.0):
  h = (C.astype(np.float64) - RC) - (R - RR)
  return np.mean(-(1 - eps) * _logsig(beta * h) - eps * _logsig(-beta * h))


def _np_ipo(beta):
  h = (C.astype(np.float64) - RC) - (R - RR)
  return np.mean((h - 1 / (2 * beta)) ** 2)


def _np_simpo(beta, gamma):
  return np.mean(-_logsig(beta * (C.astype(np.float64) / LC - R / LR) - gamma))


def _np_kto(beta, wd, wu, kl):
  lc, lr = C.astype(np.float64) - RC, R.astype(np.float64) - RR
  z = max(0.0, np.mean(np.concatenate([lc, lr])) if kl is None else kl)
  sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
  return np.mean(np.concatenate([wd * (1 - sig(beta * (lc - z))), wu * (1 - sig(beta * (z - lr)))]))


def _call(name, **hp):
  fn = objectives.PREFERENCE_LOSSES[name]
  return fn(*map(jnp.asarray, (C, R, RC, RR, LC, LR)), **hp)


@pytest.mark.parametrize(
  "name,hp,ref",
  [
    ("dpo", dict(beta=0.1), lambda: _np_dpo(0.1)),
    ("dpo", dict(beta=0.5, label_smoothing=0.2), lambda: _np_dpo(0.5, 0.2)),
    ("ipo", dict(beta=0.1), lambda: _np_ipo(0.1)),
    ("ipo", dict(beta=2.0), lambda: _np_ipo(2.0)),
    ("simpo", dict(beta=2.0, gamma=0.5), lambda: _np_simpo(2.0, 0.5)),
    ("kto", dict(beta=0.1), lambda: _np_kto(0.1, 1.0, 1.0, None)),
    ("kto", dict(beta=0.3, desirable_weight=1.5, kl=0.7), lambda: _np_kto(0.3, 1.5, 1.0, 0.7)),
    ("kto", dict(beta=0.3, kl=-2.0), lambda: _np_kto(0.3, 1.0, 1.0, -2.0)),  # z clipped at 0
  ],
)
def test_losses_equal_numpy_references_and_jit_equals_no_jit(name, hp, ref):
  loss, metrics = _call(name, **hp)
  np.testing.assert_allclose(float(loss), ref(), rtol=2e-5)
  fn = objectives.PREFERENCE_LOSSES[name]
  jitted = jax.jit(lambda *a: fn(*a, **hp))(*map(jnp.asarray, (C, R, RC, RR, LC, LR)))
  np.testing.assert_allclose(float(jitted[0]), float(loss), rtol=1e-6)
  assert 0.0 <= float(metrics["pref/accuracy"]) <= 1.0


def test_dpo_gradient_has_its_closed_form_and_the_reference_gets_none():
  """d loss / d log pi(y_c) = -beta sigmoid(-beta h) / B, d / d log pi(y_r) its negative, and the
  reference log-probs are constants."""
  beta = 0.3
  grads = jax.grad(lambda *a: preference.dpo(*a, beta=beta)[0], argnums=(0, 1, 2, 3))(
    *map(jnp.asarray, (C, R, RC, RR))
  )
  h = (C.astype(np.float64) - RC) - (R - RR)
  expect = -beta / (1 + np.exp(beta * h)) / B
  np.testing.assert_allclose(np.asarray(grads[0]), expect, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(grads[1]), -expect, rtol=1e-5)
  assert not np.any(np.asarray(grads[2])) and not np.any(np.asarray(grads[3]))


def test_dpo_tends_to_log2_as_beta_goes_to_zero_and_its_gradient_to_zero():
  for beta in (1e-3, 1e-5):
    loss, _ = _call("dpo", beta=beta)
    assert abs(float(loss) - np.log(2)) < 5 * beta * np.abs(C - RC - R + RR).mean()
  g = jax.grad(lambda c: preference.dpo(c, jnp.asarray(R), RC, RR, beta=1e-6)[0])(jnp.asarray(C))
  assert float(jnp.abs(g).max()) < 1e-6


def test_reference_free_limit_dpo_with_zero_references_is_simpo_without_margin_or_lengths():
  zeros, ones = jnp.zeros(B), jnp.ones(B)
  dpo_loss, _ = preference.dpo(jnp.asarray(C), jnp.asarray(R), zeros, zeros, beta=0.2)
  simpo_loss, _ = preference.simpo(
    jnp.asarray(C), jnp.asarray(R), None, None, ones, ones, beta=0.2, gamma=0.0
  )
  np.testing.assert_allclose(float(dpo_loss), float(simpo_loss), rtol=1e-6)
  # SimPO ignores the reference entirely
  a = _call("simpo", beta=2.0, gamma=0.5)[0]
  b = preference.simpo(*map(jnp.asarray, (C, R, RC * 9, RR - 3, LC, LR)), beta=2.0, gamma=0.5)[0]
  assert float(a) == float(b)


def test_ipo_is_minimised_at_margin_one_over_two_beta():
  beta = 0.25
  for shift in (-0.3, 0.0, 0.3):
    h = 1 / (2 * beta) + shift
    loss, _ = preference.ipo(jnp.array([h]), jnp.zeros(1), jnp.zeros(1), jnp.zeros(1), beta=beta)
    np.testing.assert_allclose(float(loss), shift**2, atol=1e-6)


def test_kto_desirable_and_undesirable_halves_move_their_own_completion():
  """KTO raises log pi(y_c) and lowers log pi(y_r) (the reference point is stop-gradient), and
  its desirable weight scales only the chosen half's gradient."""
  f = lambda c, r, wd: preference.kto(
    c, r, jnp.asarray(RC), jnp.asarray(RR), beta=0.5, desirable_weight=wd
  )[0]  # noqa: E501,E731
  gc, gr = jax.grad(f, argnums=(0, 1))(jnp.asarray(C), jnp.asarray(R), 1.0)
  assert np.all(np.asarray(gc) < 0) and np.all(np.asarray(gr) > 0)
  gc2, gr2 = jax.grad(f, argnums=(0, 1))(jnp.asarray(C), jnp.asarray(R), 2.0)
  np.testing.assert_allclose(np.asarray(gc2), 2 * np.asarray(gc), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(gr2), np.asarray(gr), rtol=1e-6)


def test_metrics_are_the_implicit_rewards():
  _, m = _call("dpo", beta=0.5)
  rc, rr = 0.5 * (C - RC), 0.5 * (R - RR)
  np.testing.assert_allclose(float(m["pref/margin"]), np.mean(rc - rr), rtol=1e-5)
  np.testing.assert_allclose(float(m["pref/accuracy"]), np.mean(rc > rr))
  assert set(objectives.PREFERENCE_LOSSES) == {"dpo", "ipo", "simpo", "kto"}
  assert preference.REFERENCE_FREE == {"simpo"}
