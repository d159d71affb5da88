"""Inference copies of the trainer's weights at a lower precision (train-inference mismatch).

``float32`` shares the trainer's arrays (no copy). ``bfloat16`` rounds every weight to bf16.
``int8`` fake-quantises every matrix symmetrically per output channel (scale = max |w| / 127
over the input axes) and rounds vectors (norms, biases) to bf16; ``int4`` does the same with 15
levels (scale = max |w| / 7), a discrepancy large enough to change what the sampler picks. The
copies keep float32 storage so the same compiled sampler runs them; only the values differ.
"""

from typing import Callable

import jax
import jax.numpy as jnp

PRECISIONS = ("float32", "bfloat16", "int8", "int4")


def _bf16(x: jax.Array) -> jax.Array:
  return x.astype(jnp.bfloat16).astype(x.dtype)


def _symmetric(x: jax.Array, levels: int) -> jax.Array:
  """Symmetric per-channel fake quantisation to integers in [-levels, levels]; the last axis is
  the output channel."""
  if x.ndim < 2:
    return _bf16(x)
  axes = tuple(range(x.ndim - 1))
  if x.ndim >= 3:  # stacked layers [L, ...]: keep a scale per layer too
    axes = tuple(range(1, x.ndim - 1))
  scale = jnp.max(jnp.abs(x), axis=axes, keepdims=True) / levels
  scale = jnp.where(scale == 0, 1.0, scale)
  return (jnp.clip(jnp.round(x / scale), -levels, levels) * scale).astype(x.dtype)


def _int8(x: jax.Array) -> jax.Array:
  return _symmetric(x, 127)


def _int4(x: jax.Array) -> jax.Array:
  return _symmetric(x, 7)


# Per-array casts by precision (float32: an unchanged copy).
LEAF_CASTS: dict[str, Callable] = {
  "float32": lambda x: x,
  "bfloat16": _bf16,
  "int8": _int8,
  "int4": _int4,
}


def make_inference_cast(precision: str) -> Callable:
  """Jitted ``params -> params`` for ``precision`` (identity for float32)."""
  if precision not in PRECISIONS:
    raise ValueError(f"unknown sampler precision {precision!r}; valid: {', '.join(PRECISIONS)}")
  if precision == "float32":
    return lambda params: params
  fn = LEAF_CASTS[precision]
  return jax.jit(lambda params: jax.tree.map(fn, params))
