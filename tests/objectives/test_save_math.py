"""SAVE's math (objectives/save_rm.py) against numpy loops and hand values, and the properties
of methods_B.md section 6 (d)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posttrain_jax.objectives import save_rm as save

RNG = np.random.default_rng(0)
R = RNG.normal(size=(3, 5)).astype(np.float32)
V = (R.mean(axis=1) + 0.1 * RNG.normal(size=(3,))).astype(np.float32)
VALID = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], np.float32)


def _np_log_sigmoid(x):
  return -np.log1p(np.exp(-x))


def _np_reference(r, v, valid, k, use_filter, objective, value_coef):
  """A plain loop version of save_loss."""
  a = r - v[:, None]
  real = valid > 0
  vals = a[real]
  delta = k * vals.std()
  contrast, count = 0.0, 0
  if objective == "anchor":
    for p in range(r.shape[0]):
      for i in range(r.shape[1]):
        if not real[p, i]:
          continue
        if a[p, i] > delta:
          contrast -= _np_log_sigmoid(r[p, i] - v[p])
          count += 1
        elif a[p, i] < -delta:
          contrast -= _np_log_sigmoid(v[p] - r[p, i])
          count += 1
  else:
    for p in range(r.shape[0]):
      for i in range(r.shape[1]):
        for j in range(r.shape[1]):
          if not (real[p, i] and real[p, j]):
            continue
          ok = (a[p, i] > delta and a[p, j] < -delta) if use_filter else a[p, i] > a[p, j]
          if ok:
            contrast -= _np_log_sigmoid(r[p, i] - r[p, j])
            count += 1
  contrast = contrast / max(count, 1)
  vl, n = 0.0, 0
  for p in range(r.shape[0]):
    if real[p].any():
      vl += (v[p] - r[p][real[p]].mean()) ** 2
      n += 1
  return contrast + value_coef * vl / n, count


@pytest.mark.parametrize(
  "use_filter,objective", [(True, "pairs"), (False, "pairs"), (True, "anchor")]
)
def test_save_loss_matches_numpy_loop(use_filter, objective):
  loss, m = save.save_loss(
    jnp.asarray(R),
    jnp.asarray(V),
    jnp.asarray(VALID),
    use_filter=use_filter,
    k=0.5,
    objective=objective,
    value_coef=0.7,
  )
  ref, count = _np_reference(R, V, VALID, 0.5, use_filter, objective, 0.7)
  assert float(loss) == pytest.approx(ref, rel=1e-5)
  assert float(m["save/pairs"]) == count
  assert count > 0


def test_advantage_has_zero_mean_when_value_is_group_mean():
  values = R.mean(axis=1)
  adv = np.asarray(save.rm_advantage(jnp.asarray(R), jnp.asarray(values)))
  np.testing.assert_allclose(adv.mean(axis=1), 0.0, atol=1e-6)
  np.testing.assert_allclose(adv, R - values[:, None], rtol=1e-6)


def test_filtered_set_shrinks_monotonically_with_delta():
  adv = jnp.asarray(RNG.normal(size=(4, 8)).astype(np.float32))
  sizes, pairs = [], []
  for delta in np.linspace(0.0, 3.0, 13):
    pos, neg = save.filter_masks(adv, delta)
    sizes.append(int(pos.sum() + neg.sum()))
    pairs.append(int(save.filter_pairs(adv, delta).sum()))
  assert all(a >= b for a, b in zip(sizes, sizes[1:]))
  assert all(a >= b for a, b in zip(pairs, pairs[1:]))
  assert sizes[0] == 32 and sizes[-1] < sizes[0]


def test_filter_delta_is_k_times_std_of_valid_rows():
  adv = R - V[:, None]
  got = float(save.filter_delta(jnp.asarray(adv), jnp.asarray(VALID), 0.5))
  assert got == pytest.approx(0.5 * adv[VALID > 0].std(), rel=1e-5)


def test_bt_loss_is_log2_at_equal_rewards_and_gradient_antisymmetric():
  r = jnp.zeros((1, 2))
  pairs = jnp.array([[[False, True], [False, False]]])  # row 0 preferred to row 1
  loss, n = save.pair_bt_loss(r, pairs)
  assert float(loss) == pytest.approx(math.log(2.0)) and float(n) == 1
  r = jnp.array([[0.3, -0.4]])
  grad = jax.grad(lambda x: save.pair_bt_loss(x, pairs)[0])(r)
  assert float(grad[0, 0]) == pytest.approx(-float(grad[0, 1]))
  assert float(grad[0, 0]) == pytest.approx(-(1 - 1 / (1 + math.exp(-0.7))), rel=1e-5)


def test_no_pairs_gives_zero_loss_and_finite_gradient():
  pairs = jnp.zeros((2, 3, 3), bool)
  loss, n = save.pair_bt_loss(jnp.asarray(R[:2, :3]), pairs)
  grad = jax.grad(lambda x: save.pair_bt_loss(x, pairs)[0])(jnp.asarray(R[:2, :3]))
  assert float(loss) == 0.0 and float(n) == 0
  assert np.all(np.asarray(grad) == 0.0)
  # all rows equal: every advantage is 0, nothing passes the filter
  flat = jnp.ones((2, 4))
  loss, m = save.save_loss(flat, jnp.ones((2,)))
  assert float(m["save/contrastive"]) == 0.0 and np.isfinite(float(loss))


def test_value_gets_no_gradient_from_pair_contrastive_loss():
  def contrastive(v):
    return save.save_loss(jnp.asarray(R), v, jnp.asarray(VALID), value_coef=0.0)[0]

  assert np.all(np.asarray(jax.grad(contrastive)(jnp.asarray(V))) == 0.0)

  def anchor(v):
    return save.save_loss(
      jnp.asarray(R), v, jnp.asarray(VALID), objective="anchor", value_coef=0.0
    )[0]

  assert np.any(np.asarray(jax.grad(anchor)(jnp.asarray(V))) != 0.0)


def test_value_loss_gradient_reaches_values_only():
  gr = jax.grad(lambda r: save.value_loss(jnp.asarray(V), r, jnp.asarray(VALID)))(jnp.asarray(R))
  assert np.all(np.asarray(gr) == 0.0)
  gv = jax.grad(lambda v: save.value_loss(v, jnp.asarray(R), jnp.asarray(VALID)))(jnp.asarray(V))
  target = np.array([R[p][VALID[p] > 0].mean() for p in range(3)])
  np.testing.assert_allclose(np.asarray(gv), 2 * (V - target) / 3, rtol=1e-5)


def test_fixed_delta_overrides_k():
  _, m = save.save_loss(jnp.asarray(R), jnp.asarray(V), delta=10.0)
  assert float(m["save/delta"]) == 10.0 and float(m["save/pairs"]) == 0


def test_pairwise_accuracy_against_enumeration():
  truth = np.array([[1.0, 0.0, 0.0, 2.0], [1.0, 1.0, 1.0, 1.0]], np.float32)
  scores = np.array([[0.5, 0.1, 0.1, 0.2], [3.0, 2.0, 1.0, 0.0]], np.float32)
  right, n = 0.0, 0
  for p in range(2):
    for i in range(4):
      for j in range(4):
        if truth[p, i] > truth[p, j]:
          n += 1
          d = scores[p, i] - scores[p, j]
          right += 1.0 if d > 0 else (0.5 if d == 0 else 0.0)
  acc, count = save.pairwise_accuracy(jnp.asarray(scores), jnp.asarray(truth))
  assert int(count) == n == 5
  assert float(acc) == pytest.approx(right / n)
  acc, count = save.pairwise_accuracy(jnp.asarray(scores[1:]), jnp.asarray(truth[1:]))
  assert float(acc) == 0.5 and int(count) == 0


def test_jit_equals_no_jit():
  args = (jnp.asarray(R), jnp.asarray(V), jnp.asarray(VALID))
  for kw in ({}, {"use_filter": False}, {"objective": "anchor"}):
    eager, m1 = save.save_loss(*args, **kw)
    jitted, m2 = jax.jit(lambda r, v, w, kw=kw: save.save_loss(r, v, w, **kw))(*args)
    assert float(eager) == pytest.approx(float(jitted), rel=1e-6)
    assert float(m1["save/pairs"]) == float(m2["save/pairs"])


def test_bad_objective_raises():
  with pytest.raises(ValueError, match="objective"):
    save.save_loss(jnp.asarray(R), jnp.asarray(V), objective="triplet")
  with pytest.raises(ValueError, match="filter"):
    save.save_loss(jnp.asarray(R), jnp.asarray(V), objective="anchor", use_filter=False)
