import chex
import jax
import numpy as np
from absl.testing import parameterized
from objective_testdata import assert_ppo_clip_pattern, loss_batch

from posttrain_jax import objectives


def _ppo_reference(new, old, adv, mask, clip_low, clip_high, dual_clip=None):
  num = den = 0.0
  for b in range(new.shape[0]):
    for t in range(new.shape[1]):
      if mask[b, t] == 0:
        continue
      r = np.exp(new[b, t] - old[b, t])
      a = adv[b]
      loss = max(-r * a, -min(max(r, 1 - clip_low), 1 + clip_high) * a)
      if dual_clip is not None and a < 0:
        loss = min(loss, -dual_clip * a)
      num += loss
      den += 1
  return num / den


class PPOClipTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters((0.2, 0.2, None), (0.2, 0.28, None), (0.1, 0.3, 3.0))
  def test_matches_numpy(self, lo, hi, dual):
    new, old, adv, mask = loss_batch(spread=0.6)
    fn = self.variant(
      lambda *a: objectives.ppo_clip(*a, clip_low=lo, clip_high=hi, dual_clip=dual)[0]
    )
    np.testing.assert_allclose(
      fn(new, old, adv, mask), _ppo_reference(new, old, adv, mask, lo, hi, dual), rtol=1e-5
    )

  def test_ratio_one_is_vanilla_surrogate(self):
    _, old, adv, mask = loss_batch()
    loss, m = objectives.ppo_clip(old, old, adv, mask)
    expected = -(adv[:, None] * mask).sum() / mask.sum()
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    np.testing.assert_allclose(m["ratio/clip_frac"], 0.0)
    # Its gradient is the policy gradient -A * mask / N.
    g = jax.grad(lambda lp: objectives.ppo_clip(lp, old, adv, mask)[0])(old)
    np.testing.assert_allclose(g, -adv[:, None] * mask / mask.sum(), rtol=1e-5, atol=1e-7)

  def test_clipped_and_masked_tokens_get_zero_gradient(self):
    new, old, adv, mask = loss_batch(spread=1.0)
    g = np.asarray(jax.grad(lambda lp: objectives.ppo_clip(lp, old, adv, mask)[0])(new))
    assert_ppo_clip_pattern(g, new, old, adv, mask)

  def test_stop_gradient_inputs(self):
    new, old, adv, mask = loss_batch()
    g_old, g_adv = jax.grad(lambda o, a: objectives.ppo_clip(new, o, a, mask)[0], argnums=(0, 1))(
      old, adv
    )
    np.testing.assert_array_equal(g_old, 0.0)
    np.testing.assert_array_equal(g_adv, 0.0)

  def test_gradient_matches_finite_differences(self):
    new, old, adv, mask = loss_batch(seed=3, spread=0.05)
    new64, old64 = new.astype(np.float64), old.astype(np.float64)
    f = lambda lp: _ppo_reference(lp, old64, adv.astype(np.float64), mask, 0.2, 0.2)
    g = np.asarray(jax.grad(lambda lp: objectives.ppo_clip(lp, old, adv, mask)[0])(new))
    eps = 1e-4
    for b, t in [(0, 0), (1, 2), (3, 4), (5, 1)]:
      if mask[b, t] == 0:
        continue
      up, down = new64.copy(), new64.copy()
      up[b, t] += eps
      down[b, t] -= eps
      np.testing.assert_allclose(g[b, t], (f(up) - f(down)) / (2 * eps), rtol=1e-3, atol=1e-6)

  def test_per_token_advantages(self):
    new, old, adv, mask = loss_batch()
    adv_bt = np.broadcast_to(adv[:, None], new.shape)
    a, _ = objectives.ppo_clip(new, old, adv, mask)
    b, _ = objectives.ppo_clip(new, old, adv_bt, mask)
    np.testing.assert_allclose(a, b, rtol=1e-6)


class ReinforceTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_matches_numpy(self):
    new, old, adv, mask = loss_batch()
    fn = self.variant(lambda *a: objectives.reinforce(*a)[0])
    expected = -(adv[:, None] * new * mask).sum() / mask.sum()
    np.testing.assert_allclose(fn(new, old, adv, mask), expected, rtol=1e-5)


def test_registry_names():
  assert {"ppo_clip", "reinforce"} <= set(objectives.POLICY_LOSSES)
  assert {"grpo", "dr_grpo"} <= set(objectives.ADVANTAGES)
