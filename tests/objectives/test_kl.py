import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

from posttrain_jax import objectives
from posttrain_jax.objectives import kl


class KLTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_estimators_match_numpy(self):
    rng = np.random.default_rng(0)
    lp = np.log(rng.uniform(0.05, 1.0, (3, 4))).astype(np.float32)
    ref = np.log(rng.uniform(0.05, 1.0, (3, 4))).astype(np.float32)
    log_r = ref - lp
    np.testing.assert_allclose(self.variant(objectives.kl_k1)(lp, ref), -log_r, rtol=1e-6)
    np.testing.assert_allclose(self.variant(objectives.kl_k2)(lp, ref), 0.5 * log_r**2, rtol=1e-6)
    np.testing.assert_allclose(
      self.variant(objectives.kl_k3)(lp, ref), np.exp(log_r) - 1 - log_r, rtol=1e-5, atol=1e-7
    )

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
    np.testing.assert_allclose(
      objectives.entropy_from_logits(logits), -(p * np.log(p)).sum(-1), rtol=1e-5
    )


def _full_kl_ref(logits, ref_logits, mask, direction):
  num = den = 0.0
  for b in range(logits.shape[0]):
    for t in range(logits.shape[1]):
      if mask[b, t] == 0:
        continue
      p = np.exp(logits[b, t] - logits[b, t].max())
      p /= p.sum()
      q = np.exp(ref_logits[b, t] - ref_logits[b, t].max())
      q /= q.sum()
      a, c = (p, q) if direction == "reverse" else (q, p)
      num += float((a * (np.log(a) - np.log(c))).sum())
      den += 1
  return num / den


class FullKLTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters("reverse", "forward")
  def test_matches_numpy(self, direction):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 4, 11)).astype(np.float32)
    ref = rng.normal(size=(3, 4, 11)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], np.float32)
    value, m = self.variant(lambda *a: kl.full_kl(*a, direction=direction))(logits, ref, mask)
    np.testing.assert_allclose(value, _full_kl_ref(logits, ref, mask, direction), rtol=1e-5)
    np.testing.assert_allclose(m[f"kl/full_{direction}"], value)
    self.assertGreater(float(value), 0.0)

  def test_directions_differ_and_zero_at_equal(self):
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 3, 5)).astype(np.float32)
    ref = (3 * rng.normal(size=(2, 3, 5))).astype(np.float32)
    mask = np.ones((2, 3), np.float32)
    fwd, _ = kl.full_kl(logits, ref, mask, direction="forward")
    rev, _ = kl.full_kl(logits, ref, mask, direction="reverse")
    self.assertGreater(abs(float(fwd) - float(rev)), 1e-3)
    zero, _ = kl.full_kl(logits, logits + 5.0, mask)  # shift-invariant softmax
    np.testing.assert_allclose(zero, 0.0, atol=1e-6)

  def test_reverse_equals_expected_k3(self):
    """Exact KL(π ‖ π_ref) = E_{y~π}[k3] with the sampled-token estimator of kl.py."""
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(1, 1, 9)).astype(np.float32)
    ref = rng.normal(size=(1, 1, 9)).astype(np.float32)
    value, _ = kl.full_kl(logits, ref, np.ones((1, 1), np.float32))
    lp = jax.nn.log_softmax(logits[0, 0])
    lq = jax.nn.log_softmax(ref[0, 0])
    k3 = kl.kl_k3(lp[None], lq[None])[0]
    np.testing.assert_allclose(value, float(np.sum(np.exp(lp) * k3)), rtol=1e-4)

  def test_gradients(self):
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(2, 3, 5)).astype(np.float32)
    ref = rng.normal(size=(2, 3, 5)).astype(np.float32)
    mask = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    for direction in ("forward", "reverse"):
      fn = lambda a, b: kl.full_kl(a, b, mask, direction=direction)[0]
      g, g_ref = jax.grad(fn, argnums=(0, 1))(logits, ref)
      np.testing.assert_array_equal(g_ref, 0.0)
      np.testing.assert_array_equal(np.asarray(g)[mask == 0], 0.0)
      self.assertTrue(np.all(np.asarray(g)[mask > 0] != 0.0))
      # Forward KL gradient w.r.t. logits is (softmax(logits) - softmax(ref)) / N.
      if direction == "forward":
        p, q = jax.nn.softmax(logits), jax.nn.softmax(ref)
        np.testing.assert_allclose(g, (p - q) * mask[..., None] / mask.sum(), atol=1e-6)

  def test_neg_inf_logits_and_bf16(self):
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(1, 2, 6)).astype(np.float32)
    logits[..., -1] = -np.inf  # a banned token
    ref = logits.copy()
    ref[..., :2] += 1.0
    mask = np.ones((1, 2), np.float32)
    for direction in ("forward", "reverse"):
      fn = lambda a: kl.full_kl(a, ref, mask, direction=direction)[0]
      value, g = jax.value_and_grad(fn)(logits)
      self.assertTrue(np.isfinite(value) and np.all(np.isfinite(g)))
    value16, _ = kl.full_kl(jnp.asarray(logits, jnp.bfloat16), jnp.asarray(ref, jnp.bfloat16), mask)
    self.assertEqual(value16.dtype, jnp.float32)
