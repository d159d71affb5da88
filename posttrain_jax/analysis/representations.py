"""Looking inside a decoder: hidden states at chosen layers and positions, the logit lens,
concept vectors by difference of means, a steering hook, and comparisons of representations
(cosine, linear CKA) between checkpoints. Detection scores (AUROC, TPR at a fixed FPR) are in
:mod:`posttrain_jax.analysis.detection`.

Layers are numbered as the model's ``hidden_states``: 0 is the embedding output, ``l`` the
residual stream after block ``l`` (1..L), before the final norm. Positions index the row's
tokens (left padding included); :func:`last_positions` gives each row's last real token.

- :func:`make_capture`: a jitted ``capture(params, tokens, start, layers, positions) -> [n, B, P,
  D]`` float32, one forward with ``return_hidden_states``; with a mesh it runs under the
  sampler role's activation sharding, rows over the batch axes, as the model does.
- :func:`logit_lens`: each captured state read out by the model's own final norm and LM head,
  ``softmax(norm(h) W_head)`` (nostalgebraist 2020); layer L's is the model's logits.
- :func:`diff_of_means`: ``v = mean(A) - mean(B)`` over two sets of states (optionally unit
  length); the direction that separates a concept's examples from its contrast.
- :func:`steering`: the ``[L, D]`` argument of ``model(..., steer=...)`` adding ``alpha v`` after
  block ``layer`` only (``layer`` in 1..L): the hidden state there moves by exactly ``alpha v``,
  earlier ones not at all.
- :func:`cosine`, :func:`linear_cka`: similarity of two vectors, and of two representations of
  the same N inputs (Kornblith et al. 2019, linear kernel, centred):
  ``CKA(X, Y) = ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F)``.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posttrain_jax import parallel


def last_positions(start: np.ndarray, length: int) -> np.ndarray:
  """[B, 1] int32: the last token of each left-padded row of ``length`` tokens (``start``: the
  rows' first real index; the last real token is always at ``length - 1``)."""
  return np.full((len(start), 1), length - 1, np.int32)


def make_capture(graphdef, *, mesh=None, rules="sampler"):
  """A jitted ``capture(params, tokens [B, T], start [B], layers, positions [B, P]) -> [n, B, P,
  D]`` float32: the hidden states at ``layers`` (a tuple of ints in 0..L, static) and, per row,
  the ``positions``."""

  def run(params, tokens, start, positions, layers):
    with parallel.activation_sharding(mesh, rules):
      out = nnx.merge(graphdef, params)(tokens, start=start, return_hidden_states=True)
    hidden = out.hidden_states[jnp.asarray(layers)].astype(jnp.float32)  # [n, B, T, D]
    idx = jnp.broadcast_to(
      positions[None, :, :, None], hidden.shape[:2] + positions.shape[1:] + hidden.shape[-1:]
    )
    return jnp.take_along_axis(hidden, idx, axis=2)

  fn = jax.jit(run, static_argnums=4)

  def capture(params, tokens, start, layers, positions):
    layers = tuple(int(x) for x in layers)
    return fn(params, tokens, start, jnp.asarray(positions, jnp.int32), layers)

  return capture


def logit_lens(graphdef, params, hidden: jax.Array) -> jax.Array:
  """``[..., D]`` hidden states -> ``[..., V]`` float32 logits through the model's final norm
  and LM head (the tied embedding when it has no head)."""
  model = nnx.merge(graphdef, params)
  embed = model.embed[...].astype(model.config.jnp_dtype)
  shape = hidden.shape
  flat = hidden.reshape((1, -1, shape[-1])).astype(model.config.jnp_dtype)
  return model.head(flat, embed).reshape(shape[:-1] + (-1,))


def diff_of_means(a: jax.Array, b: jax.Array, *, unit: bool = True) -> jax.Array:
  """``mean(a) - mean(b)`` of ``a`` [N, D] and ``b`` [M, D] (unit length when ``unit``)."""
  v = jnp.mean(a, axis=0) - jnp.mean(b, axis=0)
  return v / jnp.maximum(jnp.linalg.norm(v), 1e-12) if unit else v


def steering(num_layers: int, layer: int, vector: jax.Array, alpha: float) -> jax.Array:
  """The ``[L, D]`` ``steer`` argument that adds ``alpha * vector`` after block ``layer``
  (1..L, the hidden-state numbering) and nothing elsewhere."""
  if not 1 <= layer <= num_layers:
    raise ValueError(f"steering layer {layer} is not a block of this model (1..{num_layers})")
  steer = jnp.zeros((num_layers, vector.shape[-1]), jnp.float32)
  return steer.at[layer - 1].set(alpha * vector.astype(jnp.float32))


def cosine(u: jax.Array, v: jax.Array) -> jax.Array:
  """Cosine of two vectors (0 when one is zero)."""
  den = jnp.linalg.norm(u) * jnp.linalg.norm(v)
  return jnp.where(den > 0, jnp.dot(u, v) / jnp.maximum(den, 1e-30), 0.0)


def linear_cka(x: jax.Array, y: jax.Array) -> jax.Array:
  """Linear CKA of ``x`` [N, D1] and ``y`` [N, D2], the same N inputs in two representations:
  in [0, 1], 1 for representations equal up to rotation and isotropic scaling; NaN when one
  does not vary over the inputs (e.g. the same token's embedding in every row)."""
  x = x - jnp.mean(x, axis=0, keepdims=True)
  y = y - jnp.mean(y, axis=0, keepdims=True)
  cross = jnp.sum(jnp.square(y.T @ x))
  den = jnp.sqrt(jnp.sum(jnp.square(x.T @ x)) * jnp.sum(jnp.square(y.T @ y)))
  return jnp.where(den > 0, cross / jnp.where(den > 0, den, 1.0), jnp.nan)
