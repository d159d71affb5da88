import chex
import numpy as np
from absl.testing import parameterized

from posttrain_jax import objectives


class KLTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_estimators_match_numpy(self):
    rng = np.random.default_rng(0)
    lp = np.log(rng.uniform(0.05, 1.0, (3, 4))).astype(np.float32)
    ref = np.log(rng.uniform(0.05, 1.0, (3, 4))).astype(np.float32)
    log_r = ref - lp
    np.testing.assert_allclose(self.variant(objectives.kl_k1)(lp, ref), -log_r, rtol=1e-6)
    np.testing.assert_allclose(self.variant(objectives.kl_k2)(lp, ref), 0.5 * log_r**2,
                               rtol=1e-6)
    np.testing.assert_allclose(self.variant(objectives.kl_k3)(lp, ref),
                               np.exp(log_r) - 1 - log_r, rtol=1e-5, atol=1e-7)

  def test_unbiasedness_by_enumeration(self):
    """E_{y~p}[k1] = E_{y~p}[k3] = KL(p || q) exactly, over a categorical."""
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(6))
    q = rng.dirichlet(np.ones(6))
    kl = float((p * (np.log(p) - np.log(q))).sum())
    lp, lq = np.log(p)[None].astype(np.float32), np.log(q)[None].astype(np.float32)
    for fn in (objectives.kl_k1, objectives.kl_k3):
      np.testing.assert_allclose((p * np.asarray(fn(lp, lq))[0]).sum(), kl, rtol=1e-4)
    self.assertTrue(np.all(np.asarray(objectives.kl_k3(lp, lq)) >= 0))

  def test_entropy(self):
    logits = np.random.default_rng(2).normal(size=(2, 3, 5)).astype(np.float32)
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(objectives.entropy_from_logits(logits),
                               -(p * np.log(p)).sum(-1), rtol=1e-5)
