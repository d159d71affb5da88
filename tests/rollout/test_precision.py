"""The sampler's low-precision weight copies against a numpy reference."""

import jax.numpy as jnp
import numpy as np
import pytest

from posttrain_jax import rollout


def _reference(w: np.ndarray, levels: int) -> np.ndarray:
  """Column by column (per output channel; per layer for a stacked [L, in, out] array)."""
  out = np.empty_like(w)
  for idx in np.ndindex(*w.shape[:-2]):
    for j in range(w.shape[-1]):
      col = w[idx + (slice(None), j)]
      scale = np.abs(col).max() / levels
      scale = 1.0 if scale == 0 else scale
      out[idx + (slice(None), j)] = np.clip(np.round(col / scale), -levels, levels) * scale
  return out


@pytest.mark.parametrize("precision,levels", [("int8", 127), ("int4", 7)])
def test_integer_copies_match_a_per_channel_reference(precision, levels):
  rng = np.random.default_rng(0)
  params = {
    "w": rng.normal(size=(6, 5)).astype(np.float32),
    "stacked": rng.normal(size=(3, 4, 5)).astype(np.float32),
    "norm": rng.normal(size=(5,)).astype(np.float32),
  }
  params["w"][:, 2] = 0.0  # an all-zero channel stays zero (no division by zero)
  got = rollout.make_inference_cast(precision)({k: jnp.asarray(v) for k, v in params.items()})
  for name in ("w", "stacked"):
    want = _reference(params[name], levels)
    np.testing.assert_allclose(np.asarray(got[name]), want, rtol=1e-6, atol=1e-7)
    # Each channel uses at most 2 * levels + 1 values, and the error is at most half a step.
    col = np.asarray(got[name])[..., 0].reshape(-1, params[name].shape[-2])[0]
    assert len(np.unique(col)) <= 2 * levels + 1
    step = np.abs(params[name]).max(axis=-2, keepdims=True) / levels
    assert np.all(np.abs(np.asarray(got[name]) - params[name]) <= step / 2 + 1e-6)
  np.testing.assert_array_equal(np.asarray(got["w"])[:, 2], 0.0)
  bf16 = np.asarray(jnp.asarray(params["norm"]).astype(jnp.bfloat16).astype(jnp.float32))
  np.testing.assert_array_equal(np.asarray(got["norm"]), bf16)


def test_int4_moves_weights_more_than_int8():
  w = jnp.asarray(np.random.default_rng(1).normal(size=(64, 32)), jnp.float32)
  err = {
    p: float(jnp.abs(rollout.make_inference_cast(p)({"w": w})["w"] - w).mean())
    for p in ("int8", "int4")
  }
  assert err["int4"] > 10 * err["int8"] > 0


def test_unknown_precision_names_the_valid_ones():
  with pytest.raises(ValueError, match="int4"):
    rollout.make_inference_cast("int3")
