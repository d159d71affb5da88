"""Small array ops shared by the model files.

``dense`` is every projection of the models. It contracts as one 2-D matmul
(``[rows, in] @ [in, out]``) instead of an ``einsum`` over the batch and length axes: XLA:CPU
lowers the weight gradient of ``einsum('btd,df->btf')`` (a dot with two contracting
dimensions) to a slow path, and the tiny model's whole backward pass ran 15-25x slower than its
forward; as 2-D matmuls the MLP's backward is ~3x its forward (measured in
``tests/models/test_transformer.py`` only as equality; speed in ``scripts/bench.py``).
"""

import math

import jax
import jax.numpy as jnp


def dense(x: jax.Array, w: jax.Array, n_in: int = 1) -> jax.Array:
  """Contracts the last ``n_in`` axes of ``x`` with the first ``n_in`` axes of ``w``.

  ``x [..., *in]``, ``w [*in, *out]`` -> ``[..., *out]`` (``einsum('...i,io->...o')`` with the
  ``in`` and ``out`` axes flattened), as one 2-D matmul.
  """
  lead, inner = x.shape[: x.ndim - n_in], x.shape[x.ndim - n_in :]
  if tuple(w.shape[:n_in]) != tuple(inner):
    raise ValueError(f"dense: x {x.shape} and w {w.shape} do not share the {n_in} contracted axes")
  out = w.shape[n_in:]
  x2, w2 = x.reshape(math.prod(lead), math.prod(inner)), w.reshape(math.prod(inner), math.prod(out))
  if x.dtype == jnp.float32 and w.dtype == jnp.float32:
    y = x2 @ w2
  else:
    y = _matmul_f32_acc(x2, w2)
  return y.reshape(*lead, *out)


def _dot_f32(a: jax.Array, b: jax.Array, dtype) -> jax.Array:
  return jnp.matmul(a, b, preferred_element_type=jnp.float32).astype(dtype)


@jax.custom_vjp
def _matmul_f32_acc(x: jax.Array, w: jax.Array) -> jax.Array:
  """``x @ w`` for low-precision (bfloat16) operands, accumulated in float32 and rounded to the
  operands' type, in the forward and in both gradient products. XLA:CPU runs a bf16 x bf16 ->
  bf16 dot at the float32 rate, but bf16 x bf16 -> f32 on the AMX/AVX-512-BF16 units (this
  machine: 1,275 vs 268 GFLOP/s at 2048^3, 518 vs 144 at 64 x 512 x 2048); accelerators
  accumulate in float32 anyway. JAX's own transpose would ask for bf16 outputs, hence the
  custom gradient."""
  return _dot_f32(x, w, jnp.result_type(x.dtype, w.dtype))


def _matmul_fwd(x, w):
  return _matmul_f32_acc(x, w), (x, w)


def _matmul_bwd(res, g):
  x, w = res
  return _dot_f32(g, w.T, x.dtype), _dot_f32(x.T, g, w.dtype)


_matmul_f32_acc.defvjp(_matmul_fwd, _matmul_bwd)


def gather_logprobs(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """log softmax(logits)[targets] in float32: ``[B, T, V], [B, T] -> [B, T]``."""
  logits = logits.astype(jnp.float32)
  picked = jnp.sum(
    jnp.where(jnp.arange(logits.shape[-1]) == targets[..., None], logits, 0.0), axis=-1
  )
  return picked - jax.nn.logsumexp(logits, axis=-1)
