import functools

import chex
import jax
import numpy as np
from absl.testing import parameterized
from objective_testdata import logprob_pair as _logprob_pair

from posttrain_jax.objectives import mismatch, ppo_family

logprob_pair = functools.partial(_logprob_pair, b=5, t=7, spread=0.6)


def _level_log_ratio(trainer, sampler, mask, level):
  out = np.zeros(trainer.shape, np.float64)
  for b in range(trainer.shape[0]):
    lr = [
      float(trainer[b, t]) - float(sampler[b, t]) for t in range(trainer.shape[1]) if mask[b, t] > 0
    ]
    for t in range(trainer.shape[1]):
      if level == "token":
        out[b, t] = float(trainer[b, t]) - float(sampler[b, t])
      elif level == "sequence":
        out[b, t] = sum(lr)
      else:
        out[b, t] = sum(lr) / len(lr)
  return out


class TISTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(("token", 2.0), ("sequence", 2.0), ("geometric", 1.5))
  def test_matches_numpy(self, level, cap):
    trainer, sampler, mask = logprob_pair()
    fn = self.variant(lambda *a: mismatch.tis_weights(*a, level=level, cap=cap)[0])
    w = np.asarray(fn(trainer, sampler, mask))
    ref = np.minimum(np.exp(_level_log_ratio(trainer, sampler, mask, level)), cap) * mask
    np.testing.assert_allclose(w, ref, rtol=1e-5, atol=1e-7)
    self.assertTrue(np.all(w <= cap + 1e-6))
    self.assertTrue((ref[mask > 0] == cap).any() and (ref[mask > 0] < cap).any())
    np.testing.assert_array_equal(w[mask == 0], 0.0)

  def test_huge_sequence_ratio_is_capped_not_inf(self):
    trainer, sampler, mask = logprob_pair()
    w, m = mismatch.tis_weights(trainer + 50.0, sampler, mask, level="sequence")
    np.testing.assert_allclose(np.asarray(w)[mask > 0], 2.0, rtol=1e-6)
    np.testing.assert_allclose(m["mismatch/tis_capped_frac"], 1.0)

  def test_stop_gradient(self):
    trainer, sampler, mask = logprob_pair()
    for fn in mismatch.IS_CORRECTIONS.values():
      g_t, g_s = jax.grad(lambda a, b: fn(a, b, mask)[0].sum(), argnums=(0, 1))(trainer, sampler)
      np.testing.assert_array_equal(g_t, 0.0)
      np.testing.assert_array_equal(g_s, 0.0)

  def test_weights_feed_any_loss(self):
    trainer, sampler, mask = logprob_pair()
    adv = np.linspace(-1, 1, trainer.shape[0]).astype(np.float32)
    w, _ = mismatch.tis_weights(trainer, sampler, mask)
    loss, _ = ppo_family.reinforce(trainer, sampler, adv, mask, weights=w)
    ref = -(np.minimum(np.exp(trainer - sampler), 2.0) * adv[:, None] * trainer * mask).sum()
    np.testing.assert_allclose(loss, ref / mask.sum(), rtol=1e-5)


class MISTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters("token", "sequence", "geometric")
  def test_matches_numpy(self, level):
    trainer, sampler, mask = logprob_pair(spread=0.5)
    low, high = 0.6, 1.8
    fn = self.variant(lambda *a: mismatch.mis_weights(*a, level=level, low=low, high=high)[0])
    w = np.asarray(fn(trainer, sampler, mask))
    rho = np.exp(_level_log_ratio(trainer, sampler, mask, level))
    keep = (rho >= low) & (rho <= high) & (mask > 0)
    np.testing.assert_array_equal(w, keep.astype(np.float32))
    if level != "token":  # whole sequences are kept or dropped
      for b in range(w.shape[0]):
        self.assertEqual(len(set(w[b][mask[b] > 0].tolist())), 1)

  def test_drops_outside_band_and_keeps_ratio(self):
    _, sampler, mask = logprob_pair()
    trainer = sampler.copy()
    trainer[0, 0] += 2.0  # ρ = e^2 > high
    trainer[1, 0] -= 2.0  # ρ = e^-2 < low
    trainer[2, 0] += 0.3  # inside
    w, m = mismatch.mis_weights(trainer, sampler, mask, low=0.5, high=2.0)
    w = np.asarray(w)
    self.assertEqual(w[0, 0], 0.0)
    self.assertEqual(w[1, 0], 0.0)
    self.assertEqual(w[2, 0], 1.0)
    np.testing.assert_allclose(m["mismatch/mis_keep_frac"], 1 - 2 / mask.sum(), rtol=1e-6)
    w_seq, _ = mismatch.mis_weights(trainer, sampler, mask, level="sequence")
    np.testing.assert_array_equal(np.asarray(w_seq)[:2], 0.0)  # whole sequences dropped
    w_r, _ = mismatch.mis_weights(trainer, sampler, mask, keep_ratio=True)
    np.testing.assert_allclose(np.asarray(w_r)[2, 0], np.exp(0.3), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(w_r)[:2, 0], 0.0)

  def test_none_is_mask(self):
    trainer, sampler, mask = logprob_pair()
    w, m = mismatch.IS_CORRECTIONS["none"](trainer, sampler, mask)
    np.testing.assert_array_equal(w, mask)
    self.assertEqual(m, {})
    self.assertEqual(set(mismatch.IS_CORRECTIONS), {"none", "tis", "mis"})
    with self.assertRaises(ValueError):
      mismatch.tis_weights(trainer, sampler, mask, level="bogus")


class MetricsTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_matches_numpy(self):
    trainer, sampler, mask = logprob_pair(seed=2)
    m = self.variant(mismatch.mismatch_metrics)(trainer, sampler, mask)
    log_r = (trainer - sampler).astype(np.float64)[mask > 0]
    rho = np.exp(log_r)
    np.testing.assert_allclose(m["mismatch/k3"], np.mean(rho - 1 - log_r), rtol=1e-4)
    for q, name in ((0.05, "p05"), (0.5, "p50"), (0.95, "p95")):
      np.testing.assert_allclose(m[f"mismatch/ratio_{name}"], np.quantile(rho, q), rtol=1e-5)
    np.testing.assert_allclose(m["mismatch/ratio_max"], rho.max(), rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(0.0, 0.1, 0.37, 0.5, 0.9, 1.0)
  def test_masked_quantile(self, q):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 9)).astype(np.float32)
    mask = (rng.random((4, 9)) < 0.5).astype(np.float32)
    got = self.variant(lambda a, b: mismatch.masked_quantile(a, b, q))(x, mask)
    np.testing.assert_allclose(got, np.quantile(x[mask > 0], q), rtol=1e-5, atol=1e-6)

  def test_masked_quantile_edge_cases(self):
    x = np.array([[3.0, -1.0]], np.float32)
    np.testing.assert_allclose(mismatch.masked_quantile(x, np.zeros_like(x), 0.5), 0.0)
    np.testing.assert_allclose(mismatch.masked_quantile(x, np.array([[1.0, 0.0]]), 0.9), 3.0)

  def test_k3_by_enumeration_is_exact_kl(self):
    """E_{y~μ}[k3] = KL(μ ‖ π): weigh each vocabulary entry by μ through the float mask."""
    rng = np.random.default_rng(4)
    mu, pi = rng.dirichlet(np.ones(8)), rng.dirichlet(np.ones(8))
    kl = float((mu * (np.log(mu) - np.log(pi))).sum())
    m = mismatch.mismatch_metrics(
      np.log(pi)[None].astype(np.float32),
      np.log(mu)[None].astype(np.float32),
      mu[None].astype(np.float32),
    )
    np.testing.assert_allclose(m["mismatch/k3"], kl, rtol=1e-4)

  def test_k3_monte_carlo(self):
    rng = np.random.default_rng(5)
    mu, pi = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
    kl = float((mu * (np.log(mu) - np.log(pi))).sum())
    y = rng.choice(6, size=(200, 500), p=mu)
    m = mismatch.mismatch_metrics(
      np.log(pi)[y].astype(np.float32),
      np.log(mu)[y].astype(np.float32),
      np.ones(y.shape, np.float32),
    )
    np.testing.assert_allclose(m["mismatch/k3"], kl, rtol=0.05)
