"""Gradient-variance statistics against numpy (the script runs in test_reproduce_smoke)."""

import numpy as np
import pytest

from posttrain_jax.sweeps import grad_variance


def test_moments_match_numpy():
  rng = np.random.default_rng(0)
  true_mean = rng.normal(size=50)
  grads = true_mean + rng.normal(scale=2.0, size=(400, 50))
  m = grad_variance.moments(50)
  for g in grads:
    m.add(g)
  s = m.summary()
  trace_var = np.var(grads, axis=0, ddof=1).sum()
  np.testing.assert_allclose(s["total_variance"], trace_var, rtol=1e-9)
  np.testing.assert_allclose(m.mean, grads.mean(0), rtol=1e-12)
  np.testing.assert_allclose(s["signal"], grads.mean(0) @ grads.mean(0) - trace_var / 400,
                             rtol=1e-9)
  # Unbiased: close to the true ||E g||² = ||μ||² and tr Var = 50 · 4.
  assert s["signal"] == pytest.approx(true_mean @ true_mean, rel=0.1)
  assert s["total_variance"] == pytest.approx(200.0, rel=0.1)
  assert s["relative_variance"] == pytest.approx(s["total_variance"] / s["signal"])
