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
  np.testing.assert_allclose(
    s["signal"], grads.mean(0) @ grads.mean(0) - trace_var / 400, rtol=1e-9
  )
  # Unbiased: close to the true ||E g||² = ||μ||² and tr Var = 50 · 4.
  assert s["signal"] == pytest.approx(true_mean @ true_mean, rel=0.1)
  assert s["total_variance"] == pytest.approx(200.0, rel=0.1)
  assert s["relative_variance"] == pytest.approx(s["total_variance"] / s["signal"])


def test_the_measured_gradient_is_the_policy_gradient():
  """``_gradient_fn`` at ratio 1 is -∇ Σ A_b log π(y_bt) m_bt / Σ m for PPO-clip with token-mean
  aggregation (the policy-gradient form, written out here independently); doubling the
  advantages doubles it, and a different estimator's advantages change it."""
  import types

  import jax
  import jax.numpy as jnp
  from flax import nnx
  from jax.flatten_util import ravel_pytree

  from posttrain_jax import defaults, models, rollout
  from posttrain_jax.train import updates

  graphdef, params = nnx.split(
    models.Decoder(models.preset("nano", vocab_size=19), rngs=nnx.Rngs(0))
  )
  tokens, mask = rollout.left_pad([[5, 6, 7], [8, 9], [10, 11, 12, 13], [5, 9]], 0)
  ro = rollout.make_sampler(graphdef, rollout.SamplerConfig(5, 1, 0))(
    params, tokens, mask, jax.random.key(0)
  )
  ctx = types.SimpleNamespace(graphdef=graphdef, prompt_len=ro.prompt_len)
  cfg = defaults.base_config().rl
  adv = jnp.asarray([1.0, -0.5, 0.25, -2.0], jnp.float32)
  grad = grad_variance._gradient_fn(ctx, cfg)
  got = np.asarray(grad(params, ro.tokens, ro.start, ro.completion_mask, adv))

  def pg(p):
    logprobs, _ = updates.sequence_logprobs(graphdef, p, ro.tokens, ro.start, ro.prompt_len)
    m = ro.completion_mask
    return -jnp.sum(adv[:, None] * logprobs * m) / jnp.sum(m)

  want = np.asarray(ravel_pytree(jax.grad(pg)(params))[0])
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)
  assert np.linalg.norm(want) > 0
  doubled = np.asarray(grad(params, ro.tokens, ro.start, ro.completion_mask, 2 * adv))
  np.testing.assert_allclose(doubled, 2 * got, rtol=1e-4, atol=1e-7)
