import chex
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain_jax import objectives


def _grpo_reference(rewards, group, valid, normalize_std, eps=1e-6):
  adv = np.zeros_like(rewards)
  for g in np.unique(group):
    idx = [i for i in range(len(rewards)) if group[i] == g and valid[i] > 0]
    if not idx:
      continue
    r = rewards[idx]
    centred = r - r.mean()
    std = r.std(ddof=1) if len(r) > 1 else 0.0
    adv[idx] = centred / (std + eps) if normalize_std else centred
  return adv


class GRPOTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(True, False)
  def test_matches_numpy_with_variable_groups(self, normalize_std):
    rng = np.random.default_rng(0)
    # 4 prompt slots with 5, 3, 1 and 0 real rollouts, padded to 4 x 5 rows.
    group = np.repeat(np.arange(4), 5).astype(np.int32)
    valid = np.zeros(20, np.float32)
    for g, n in enumerate([5, 3, 1, 0]):
      valid[g * 5 : g * 5 + n] = 1.0
    rewards = rng.normal(size=20).astype(np.float32)
    fn = self.variant(
      lambda r, g, v: objectives.grpo(r, g, v, num_groups=4, normalize_std=normalize_std)[0]
    )
    out = np.asarray(fn(rewards, group, valid))
    ref = _grpo_reference(rewards, group, valid, normalize_std)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out[valid == 0], 0.0)

  def test_dr_grpo_is_unnormalised_grpo(self):
    r = jnp.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    g = jnp.array([0, 0, 0, 1, 1, 1], jnp.int32)
    v = jnp.ones(6)
    a, _ = objectives.dr_grpo(r, g, v, num_groups=2)
    b, _ = objectives.grpo(r, g, v, num_groups=2, normalize_std=False)
    np.testing.assert_allclose(a, b)

  def test_zero_signal_groups_metric(self):
    r = jnp.array([1.0, 1.0, 0.0, 1.0])
    g = jnp.array([0, 0, 1, 1], jnp.int32)
    adv, m = objectives.grpo(r, g, jnp.ones(4), num_groups=2)
    np.testing.assert_allclose(adv[:2], 0.0)
    np.testing.assert_allclose(m["adv/zero_signal_groups"], 0.5)


@settings(max_examples=30, deadline=None)
@given(
  st.lists(st.floats(-10, 10, width=32), min_size=8, max_size=8),
  st.floats(-5, 5),
  st.floats(0.1, 10),
)
def test_grpo_properties(rewards, shift, scale):
  r = np.asarray(rewards, np.float32)
  g = np.repeat(np.arange(2), 4).astype(np.int32)
  v = np.ones(8, np.float32)
  adv, _ = objectives.grpo(r, g, v, num_groups=2)
  adv = np.asarray(adv)
  # Centred within each group.
  np.testing.assert_allclose(adv.reshape(2, 4).sum(1), 0.0, atol=1e-3)
  # Invariant to a shift of the rewards; with std normalisation also to a positive scale.
  if all(np.ptp(r.reshape(2, 4), axis=1) > 1e-2):
    adv0, _ = objectives.grpo(r, g, v, num_groups=2, eps=0.0)
    adv2, _ = objectives.grpo(r * scale + shift, g, v, num_groups=2, eps=0.0)
    np.testing.assert_allclose(np.asarray(adv2), np.asarray(adv0), rtol=1e-3, atol=1e-3)
  d1, _ = objectives.dr_grpo(r, g, v, num_groups=2)
  d2, _ = objectives.dr_grpo(r + shift, g, v, num_groups=2)
  np.testing.assert_allclose(np.asarray(d1), np.asarray(d2), atol=1e-4)
