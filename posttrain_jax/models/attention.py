"""Attention kernels beside the reference :func:`transformer.attention`.

Each computes the reference's grouped-query softmax attention (``softmax(q k^T / sqrt(hd))
v`` over the unmasked keys, scores and softmax in float32), formulated for a backend:

* :func:`grouped_products`: the two products batched over (batch, kv head) with a group's query
  heads and the queries folded into one row axis; reads keys in the decode cache's transposed
  layout ``[B, K, hd, S]`` (``models/decode_cache.py``) or as ``[B, K, S, hd]``.
* :func:`causal_blocks`: the full causal forward in blocks of queries, each against the keys
  up to its block's end only (about half the score matrix for long sequences).
* :func:`dot_product_attention`: ``jax.nn.dot_product_attention`` (XLA, or cuDNN's fused
  kernel on GPU), chosen by ``config.attention_impl`` (:func:`implementation`).

Shapes: ``B`` batch, ``T`` queries, ``S`` keys, ``H`` query heads, ``K`` kv heads, ``G = H/K``,
``hd`` head dim. ``mask`` is ``[B, T, S]`` bool (True: the query may read the key).
"""

import jax
import jax.numpy as jnp

from posttrain_jax.models.config import ModelConfig

NEG_INF = -1e30


def implementation(config: ModelConfig) -> str:
  """The full forward's attention: 'reference' (:func:`transformer.attention`, or
  :func:`causal_blocks` with ``config.causal_block``), or 'xla' / 'cudnn' for
  :func:`dot_product_attention`.

  ``attention_impl`` 'auto' is 'cudnn' on GPU for 16-bit compute with a head dim cuDNN's fused
  kernel takes (a multiple of 8, at most 128), 'xla' on GPU otherwise, and 'reference' on other
  backends (the formulation measured fastest on XLA:CPU).
  """
  impl = config.attention_impl
  if impl != "auto":
    return impl
  if jax.default_backend() != "gpu":
    return "reference"
  cudnn = config.dtype == "bfloat16" and config.head_dim % 8 == 0 and config.head_dim <= 128
  return "cudnn" if cudnn else "xla"


def dot_product_attention(
  q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array, *, implementation: str = "xla"
) -> jax.Array:
  """``jax.nn.dot_product_attention`` of ``q`` [B, T, H, hd] over ``keys`` and ``values``
  [B, S, K, hd] (grouped-query attention when K < H) -> [B, T, H, hd].

  ``mask`` [B, T, S] is passed as a [B, 1, T, S] boolean mask. A query with no unmasked key
  (left padding before a row's start) gets some average of the values, as in the reference;
  no real position reads it.
  """
  return jax.nn.dot_product_attention(
    q, keys, values, mask=mask[:, None], implementation=implementation
  )


def grouped_products(
  q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array, *, keys_transposed: bool
) -> jax.Array:
  """Attention as two products batched over (B, K): ``q`` [B, T, H, hd], ``keys``
  [B, K, hd, S] (``keys_transposed``, the decode cache's layout) or [B, K, S, hd], ``values``
  [B, K, S, hd], ``mask`` [B, T, S] -> [B, T, H, hd].

  Each kv head's G query heads and the T queries form one row axis of ``G*T`` rows, so both
  products contract canonically: ``[G*T, hd] x [hd, S]`` then ``[G*T, S] x [S, hd]``.
  """
  B, T, H, hd = q.shape
  K = keys.shape[1]
  G = H // K
  scale = hd**-0.5
  qg = jnp.transpose(q.reshape(B, T, K, G, hd), (0, 2, 3, 1, 4)).reshape(B, K, G * T, hd)
  batch = ((0, 1), (0, 1))
  contract = 2 if keys_transposed else 3
  scores = jax.lax.dot_general(qg, keys, (((3,), (contract,)), batch)).astype(jnp.float32)
  scores = scores.reshape(B, K, G, T, -1) * scale
  scores = jnp.where(mask[:, None, None], scores, NEG_INF)
  probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype).reshape(B, K, G * T, -1)
  out = jax.lax.dot_general(probs, values, (((3,), (2,)), batch))  # [B, K, G*T, hd]
  return jnp.transpose(out.reshape(B, K, G, T, hd), (0, 3, 1, 2, 4)).reshape(B, T, H, hd)


def causal_blocks(
  q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array, block: int
) -> jax.Array:
  """Causal attention in blocks of ``block`` queries: ``q`` [B, T, H, hd], ``keys`` and
  ``values`` [B, S, K, hd] with S >= T, the T queries being the last T of the S positions
  (the first ``S - T`` keys precede every query: a shared prompt's, see ``models/grouped.py``),
  ``mask`` [B, T, S] causal -> [B, T, H, hd].

  Block ``[s, e)`` attends to the keys ``[0, S - T + e)`` only, skipping the rest of the
  upper triangle. Exact for every query with at least one unmasked key; a query with none
  (left padding before a row's start) averages fewer masked values than the reference, and
  no real position reads it.
  """
  T = q.shape[1]
  off = keys.shape[1] - T
  keys, values = jnp.swapaxes(keys, 1, 2), jnp.swapaxes(values, 1, 2)  # [B, K, S, hd], once
  outs = []
  for s in range(0, T, block):
    e = min(T, s + block)
    outs.append(
      grouped_products(
        q[:, s:e],
        keys[:, :, : off + e],
        values[:, :, : off + e],
        mask[:, s:e, : off + e],
        keys_transposed=False,
      )
    )
  return jnp.concatenate(outs, axis=1)
