"""Numca and Hista state values (objectives/state_values.py; methods_B.md section 12 (d)) against
numpy loops, with the section's properties: a uniform kernel gives the leave-one-out group mean,
identical states give the mean of the other rollouts, Numca values lie in [0, 1] for binary
rewards, a rollout's own reward never enters its value, a prefix without numbers gets the
group mean; plus masked tokens get zero advantage, jit = no jit, and the milestone parser."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posttrain_jax import objectives
from posttrain_jax.objectives import state_values as sv

GROUP = jnp.asarray([0, 0, 0, 0, 1, 1, 1, 2], jnp.int32)
VALID = jnp.asarray([1, 1, 1, 1, 1, 1, 0, 1], jnp.float32)  # row 6 padding, row 7 alone
B, T, D = 8, 5, 6


def _mask():
  lengths = np.asarray([5, 3, 4, 5, 2, 5, 5, 4])
  return jnp.asarray((np.arange(T)[None] < lengths[:, None]).astype(np.float32))


def _loo(rewards, group, valid):
  r, g, v = (np.asarray(x) for x in (rewards, group, valid))
  out = np.zeros(len(r))
  for i in range(len(r)):
    others = [j for j in range(len(r)) if j != i and g[j] == g[i] and v[j] > 0]
    out[i] = np.mean(r[others]) if others else r[i]
  return out


def _numca_reference(rewards, group, valid, keys, mask):
  r, g, v, k, m = (np.asarray(x) for x in (rewards, group, valid, keys, mask))
  loo = _loo(r, g, v)
  out = np.zeros((B, T))
  for i in range(B):
    others = [j for j in range(B) if j != i and g[j] == g[i] and v[j] > 0]
    for t in range(T):
      if m[i, t] == 0:
        continue
      if not others:
        out[i, t] = r[i]
        continue
      state = k[i, t - 1] if t > 0 else sv.NO_STATE  # the numbers completed before token t
      if state == sv.NO_STATE:
        out[i, t] = loo[i]
        continue
      hit = [j for j in others if any(k[j, s] == state and m[j, s] > 0 for s in range(T))]
      out[i, t] = np.mean(r[hit]) if hit else loo[i]
  return out


def _hista_reference(rewards, group, valid, hidden, mask, tau):
  r, g, v, h, m = (np.asarray(x, np.float64) for x in (rewards, group, valid, hidden, mask))
  h = h / np.linalg.norm(h, axis=-1, keepdims=True)
  out = np.zeros((B, T))
  for i in range(B):
    for t in range(T):
      if m[i, t] == 0:
        continue
      num = den = 0.0
      for j in range(B):
        if j == i or g[j] != g[i] or v[j] == 0:
          continue
        for s in range(T):
          if m[j, s] > 0:
            w = np.exp(h[i, t] @ h[j, s] / tau)
            num, den = num + w * r[j], den + w
      out[i, t] = num / den if den else r[i]
  return out


@pytest.fixture
def batch():
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  rewards = jax.random.bernoulli(k1, 0.5, (B,)).astype(jnp.float32)
  keys = jax.random.randint(k2, (B, T), -1, 3)
  hidden = jax.random.normal(k3, (B, T, D))
  return rewards, keys, hidden, _mask() * VALID[:, None]


def test_numca_matches_a_numpy_loop_and_is_leave_one_out(batch):
  rewards, keys, _, mask = batch
  got = sv.numca_values(rewards, GROUP, VALID, keys, mask)
  want = _numca_reference(rewards, GROUP, VALID, keys, mask)
  np.testing.assert_allclose(got, want, atol=1e-6)
  assert float(got.min()) >= 0.0 and float(got.max()) <= 1.0  # binary rewards
  # a rollout's own reward never enters its own value (a lone rollout: its own, A = 0)
  for i in range(6):
    flipped = rewards.at[i].set(1.0 - rewards[i])
    again = sv.numca_values(flipped, GROUP, VALID, keys, mask)
    np.testing.assert_allclose(again[i], got[i], atol=1e-7)
  np.testing.assert_allclose(got[7], rewards[7] * mask[7])
  # a token's own number never enters its baseline: its value reads the state before it
  changed = keys.at[0, 2].set(99)
  np.testing.assert_array_equal(
    sv.numca_values(rewards, GROUP, VALID, changed, mask)[0, :3], got[0, :3]
  )
  # a prefix without numbers gets the leave-one-out group mean
  none = jnp.full((B, T), sv.NO_STATE, jnp.int32)
  flat = sv.numca_values(rewards, GROUP, VALID, none, mask)
  loo = _loo(rewards, GROUP, VALID)
  np.testing.assert_allclose(flat, np.asarray(mask) * loo[:, None], atol=1e-6)


def test_hista_matches_a_numpy_loop_and_its_limits(batch):
  rewards, _, hidden, mask = batch
  rewards = rewards + 0.25 * jnp.arange(B)  # distinct rewards make every weight visible
  got = sv.hista_values(rewards, GROUP, VALID, hidden, mask, tau=0.5)
  np.testing.assert_allclose(
    got, _hista_reference(rewards, GROUP, VALID, hidden, mask, 0.5), atol=1e-5
  )
  # a uniform kernel (tau -> inf): the other rollouts' rewards weighted by their token counts;
  # with equal lengths, the leave-one-out group mean
  full = VALID[:, None] * jnp.ones((B, T))
  uniform = sv.hista_values(rewards, GROUP, VALID, hidden, full, tau=1e9)
  np.testing.assert_allclose(uniform, _loo(rewards, GROUP, VALID)[:, None] * full, atol=1e-4)
  # identical states in every rollout: the mean of the other rollouts' rewards
  same = jnp.broadcast_to(hidden[0, 0], hidden.shape)
  np.testing.assert_allclose(
    sv.hista_values(rewards, GROUP, VALID, same, full, tau=0.1),
    _loo(rewards, GROUP, VALID)[:, None] * full,
    atol=1e-5,
  )
  # leave-one-out
  flipped = rewards.at[0].add(10.0)
  np.testing.assert_allclose(
    sv.hista_values(flipped, GROUP, VALID, hidden, mask)[0],
    sv.hista_values(rewards, GROUP, VALID, hidden, mask)[0],
    atol=1e-6,
  )
  # top-m: one neighbour is the most similar other-rollout token's reward
  one = sv.hista_values(rewards, GROUP, VALID, hidden, mask, tau=0.1, top_m=1)
  h = np.asarray(hidden) / np.linalg.norm(np.asarray(hidden), axis=-1, keepdims=True)
  i, t = 0, 0
  best = max(
    ((h[i, t] @ h[j, s], j) for j in (1, 2, 3) for s in range(T) if mask[j, s] > 0),
  )
  assert float(one[i, t]) == pytest.approx(float(rewards[best[1]]))


def test_registry_entries_give_masked_token_advantages_and_jit_equals_eager(batch):
  rewards, keys, hidden, mask = batch
  inputs = objectives.AdvantageInputs(
    rewards=rewards, group=GROUP, valid=VALID, mask=_mask(), milestones=keys, hidden=hidden
  )
  for name in ("numca", "hista"):
    fn = objectives.ADVANTAGES[name]
    adv, metrics = fn(inputs, num_groups=3)
    jitted, _ = jax.jit(lambda x, fn=fn: fn(x, num_groups=3))(inputs)
    np.testing.assert_allclose(adv, jitted, atol=1e-6)
    assert adv.shape == (B, T)
    np.testing.assert_array_equal(np.asarray(adv)[np.asarray(mask) == 0], 0.0)  # masked, padding
    values = (
      sv.numca_values(rewards, GROUP, VALID, keys, mask)
      if name == "numca"
      else sv.hista_values(rewards, GROUP, VALID, hidden, mask)
    )
    np.testing.assert_allclose(adv, (rewards[:, None] - values) * mask, atol=1e-6)
    assert f"adv/{name}_value_mean" in metrics
  # the share of tokens whose state another rollout reached (else the group-mean fallback)
  fn = objectives.ADVANTAGES["numca"]
  none = inputs._replace(milestones=jnp.full((B, T), sv.NO_STATE, jnp.int32))
  assert float(fn(none, num_groups=3)[1]["adv/numca_matched"]) == 0.0
  same = inputs._replace(milestones=jnp.full((B, T), 5, jnp.int32))
  m = np.asarray(mask).copy()
  m[7] = 0  # alone in its group: nobody else to match
  want = m[:, 1:].sum() / np.asarray(mask).sum()  # every token after the first
  assert float(fn(same, num_groups=3)[1]["adv/numca_matched"]) == pytest.approx(want)
  with pytest.raises(ValueError, match="AdvantageInputs.milestones"):
    objectives.ADVANTAGES["numca"](inputs._replace(milestones=None), num_groups=3)


def test_milestone_keys_mark_completed_numbers_and_carry_them_forward():
  pieces = [list("12+3=15"), list("x=-4.5;"), list("none"), ["1", "2", "0", " ", "7"]]
  keys = sv.milestone_keys(pieces, [7, 7, 4, 4])
  k = keys[0]
  assert (k[:1] == sv.NO_STATE).all()  # "1" goes on with "2": not complete
  assert k[1] == k[2] != sv.NO_STATE  # "12" completes at token 1, carried over "+"
  assert k[3] == k[4] != k[1]  # "12 3"
  assert k[5] == k[4] and k[6] != k[5]  # "15" completes at the last token
  assert (keys[1, :5] == sv.NO_STATE).all() and keys[1, 5] == keys[1, 6] != sv.NO_STATE
  assert (keys[2] == sv.NO_STATE).all()
  assert keys[3, 2] == keys[3, 3] != sv.NO_STATE and keys[3, 4] == sv.NO_STATE  # past length
  # the same numbers so far give the same key in another rollout
  other = sv.milestone_keys([list("12+3")], [4])
  assert other[0, 3] == keys[0, 3]
