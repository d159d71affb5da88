"""modelops.merge.average against numpy, and the bit-identity of what a zero weight leaves out."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posttrain_jax import modelops
from posttrain_jax.modelops import merge


def _tree(seed, dtype=jnp.float32):
  k1, k2 = jax.random.split(jax.random.key(seed))
  return {
    "w": jax.random.normal(k1, (3, 4)).astype(dtype),
    "layer": {"b": jax.random.normal(k2, (5,)).astype(dtype)},
  }


def test_weighted_average_equals_numpy_leaf_by_leaf():
  trees, weights = [_tree(0), _tree(1), _tree(2)], (0.2, 0.3, 0.5)
  got = merge.average(trees, weights=weights)
  for path in (("w",), ("layer", "b")):
    leaves = [np.asarray(t[path[0]] if len(path) == 1 else t[path[0]][path[1]]) for t in trees]
    want = sum(w * x.astype(np.float64) for w, x in zip(weights, leaves))
    have = got[path[0]] if len(path) == 1 else got[path[0]][path[1]]
    np.testing.assert_allclose(np.asarray(have), want, rtol=1e-6, atol=1e-6)


def test_default_weights_are_equal_and_order_does_not_matter():
  a, b = _tree(0), _tree(1)
  ab, ba = merge.average([a, b]), merge.average([b, a], weights=(0.5, 0.5))
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-7), ab, ba)


def test_a_zero_weight_leaves_a_tree_out_bit_for_bit():
  a, b = _tree(0), _tree(1)
  b = jax.tree.map(lambda x: x.at[0].set(jnp.nan), b)  # never read: no NaN leaks through
  got = merge.average([a, b], weights=(1.0, 0.0))
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(a)):
    assert np.array_equal(np.asarray(x), np.asarray(y))
    assert x.dtype == y.dtype


def test_dtypes_are_kept_and_the_mix_is_computed_in_float32():
  a, b = _tree(0, jnp.bfloat16), _tree(1, jnp.bfloat16)
  got = merge.average([a, b])
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(got))
  want = jax.tree.map(
    lambda x, y: ((x.astype(jnp.float32) + y.astype(jnp.float32)) * 0.5).astype(jnp.bfloat16), a, b
  )
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert np.array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32))


@pytest.mark.parametrize(
  "weights,message",
  [((0.5,), r"got 1 weights for 2 trees"), ((0.5, 0.6), r"sum to 1.1, not 1")],
)
def test_bad_weights_are_refused(weights, message):
  with pytest.raises(ValueError, match=message):
    merge.average([_tree(0), _tree(1)], weights=weights)
  with pytest.raises(ValueError, match="at least one"):
    merge.average([])


def test_the_registry_holds_average():
  assert modelops.MODEL_OPS["average"] is merge.average


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_merging_a_model_with_itself_is_the_identity(dtype):
  a = _tree(3, dtype)
  for trees in ([a, a], [a, a, a, a]):
    got = merge.average(trees)
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), got, a)
