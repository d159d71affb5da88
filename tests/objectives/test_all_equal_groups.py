"""All-equal groups give exactly zero advantage, whatever the reward's value (not only 0/1):
the float32 group mean can be one rounding step off, which a tiny std would blow up."""

import jax.numpy as jnp
import numpy as np
import pytest

from posttrain_jax import objectives

VALUES = (7.3, 0.7, 0.1, -2.9, 1e6 + 0.3)


def _rows(groups):
  rewards = jnp.asarray([r for r, n in groups for _ in range(n)], jnp.float32)
  group = jnp.asarray([g for g, (_, n) in enumerate(groups) for _ in range(n)], jnp.int32)
  return rewards, group, jnp.ones(rewards.shape, jnp.float32)


@pytest.mark.parametrize(
  "name", ["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"]
)
@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("n", [3, 16, 19])
def test_all_equal_rewards_give_exactly_zero(name, value, n):
  rewards, group, valid = _rows([(value, n)])
  adv, _ = objectives.ADVANTAGES[name](
    objectives.AdvantageInputs(rewards, group, valid), num_groups=1
  )
  np.testing.assert_array_equal(np.asarray(adv), 0.0)


def test_the_issue_examples():
  adv, m = objectives.grpo(*_rows([(7.3, 3)]), num_groups=1)
  np.testing.assert_array_equal(np.asarray(adv), 0.0)
  assert float(m["adv/zero_signal_groups"]) == 1.0
  adv, _ = objectives.reinforce_pp_baseline(*_rows([(7.3, 3), (0.1, 7)]), num_groups=2)
  np.testing.assert_array_equal(np.asarray(adv), 0.0)
  rewards, _, valid = _rows([(0.7, 19)])
  adv, _ = objectives.reinforce_pp(rewards, valid)
  np.testing.assert_array_equal(np.asarray(adv), 0.0)


def test_a_flat_group_beside_a_live_one():
  """The flat group gets 0 and is counted; the other group keeps its centred advantages."""
  rewards, group, valid = _rows([(7.3, 3), (0.0, 2), (1.0, 2)])
  group = jnp.asarray([0, 0, 0, 1, 1, 1, 1], jnp.int32)
  adv, m = objectives.grpo(rewards, group, valid, num_groups=2)
  np.testing.assert_array_equal(np.asarray(adv[:3]), 0.0)
  r = np.asarray([0.0, 0.0, 1.0, 1.0])
  want = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
  np.testing.assert_allclose(np.asarray(adv[3:]), want, rtol=1e-6)
  assert float(m["adv/zero_signal_groups"]) == 0.5


def test_masked_whiten_of_equal_entries_is_zero_and_padding_ignored():
  x = jnp.asarray([0.7] * 19 + [5.0], jnp.float32)
  mask = jnp.asarray([1.0] * 19 + [0.0])
  np.testing.assert_array_equal(np.asarray(objectives.masked_whiten(x, mask)), 0.0)
  y = jnp.asarray([1.0, 2.0, 3.0, 9.0], jnp.float32)
  out = objectives.masked_whiten(y, jnp.asarray([1.0, 1.0, 1.0, 0.0]))
  np.testing.assert_allclose(np.asarray(out[:3]), [-1.2247449, 0.0, 1.2247449], rtol=1e-5)
  assert float(out[3]) == 0.0
