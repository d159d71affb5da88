import chex
import jax
import numpy as np
import pytest
from absl.testing import parameterized

from posttrain_jax import objectives


def _data(seed=0, b=5, t=7):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(b, t)).astype(np.float32)
  mask = (rng.random((b, t)) < 0.7).astype(np.float32)
  mask[0] = 0.0  # an empty row
  return x, mask


def _reference(x, mask, mode, norm_length=None):
  b, t = x.shape
  if mode == "token_mean":
    return (x * mask).sum() / mask.sum()
  rows = [r for r in range(b) if mask[r].sum() > 0]
  if mode == "seq_mean_token_mean":
    return np.mean([(x[r] * mask[r]).sum() / mask[r].sum() for r in rows])
  if mode == "seq_mean_token_sum":
    return np.mean([(x[r] * mask[r]).sum() for r in rows])
  if mode == "seq_mean_token_sum_norm":  # B: real rows (the empty padding row 0 is not one)
    return (x * mask).sum() / (len(rows) * (norm_length or t))
  raise ValueError(mode)


class AggregateTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(
    "token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"
  )
  def test_matches_numpy(self, mode):
    x, mask = _data()
    fn = self.variant(lambda a, m: objectives.aggregate(a, m, mode=mode).value)
    np.testing.assert_allclose(fn(x, mask), _reference(x, mask, mode), rtol=1e-5)

  @parameterized.parameters(
    "token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm", "seq_mean_token_mean"
  )
  def test_exact_across_microbatches(self, mode):
    x, mask = _data(1, b=8)
    whole = objectives.aggregate(x, mask, mode=mode)
    parts = [objectives.aggregate(x[i : i + 2], mask[i : i + 2], mode=mode) for i in range(0, 8, 2)]
    num = sum(p.numerator for p in parts)
    den = sum(p.denominator for p in parts)
    np.testing.assert_allclose(num / den, whole.value, rtol=1e-6)

  def test_masked_entries_get_no_gradient_and_no_nan(self):
    x, mask = _data(2)
    x = np.where(mask > 0, x, np.inf).astype(np.float32)  # garbage under the mask
    g = jax.grad(lambda a: objectives.aggregate(a, mask, mode="token_mean").value)(x)
    self.assertTrue(np.all(np.isfinite(g)))
    np.testing.assert_array_equal(np.asarray(g)[mask == 0], 0.0)

  def test_unknown_mode_lists_valid(self):
    x, mask = _data()
    with pytest.raises(ValueError, match="token_mean"):
      objectives.aggregate(x, mask, mode="nope")


def test_masked_whiten_matches_numpy():
  x, mask = _data(3)
  out = np.asarray(objectives.masked_whiten(x, mask))
  vals = x[mask > 0]
  ref = (x - vals.mean()) / (vals.std() + 1e-8)
  np.testing.assert_allclose(out[mask > 0], ref[mask > 0], rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(out[mask == 0], 0.0)
