"""The KV cache of decoding: its layout, the attention that reads it, and the sampler's API.

Layout: one buffer per layer (a layer's attention reads and updates its own buffer in place),
keys transposed to ``[B, K, hd, S]`` so that a decode step's scores are one batched
``[G, hd] x [hd, S]`` product per (row, kv head) with the output axis S minor
(:func:`attention.grouped_products`), values ``[B, K, S, hd]``.

A sampler uses only the functions below (:func:`init_cache`, :func:`prefill`,
:func:`prefill_shared`, :func:`decode_step`, :func:`grow`, :func:`constrain`); none of it
indexes the buffers. The model's cached call (``Decoder.__call__(..., cache=)``) runs its
layers with :func:`cached_layers` and then :meth:`KVCache.advance`.

Shapes: ``B`` rows, ``T`` tokens in this call, ``S`` cache length, ``L`` layers, ``K`` kv
heads, ``hd`` head dim, ``V`` vocabulary.
"""

import functools

import jax
import jax.numpy as jnp
from flax import struct

from posttrain_jax import parallel
from posttrain_jax.models import attention
from posttrain_jax.models.config import ModelConfig


@struct.dataclass
class KVCache:
  """Preallocated key/value cache, one buffer per layer.

  Attributes:
    k: L arrays [B, K, hd, S] of keys (transposed).
    v: L arrays [B, K, S, hd] of values.
    index: [] int32, the next position to write (the same for every row: prompts are left-padded).
    start: [B] int32, first real position of each row.
  """

  k: tuple
  v: tuple
  index: jax.Array
  start: jax.Array

  @property
  def length(self) -> int:
    """S, the number of positions the cache holds."""
    return self.v[0].shape[2]

  def layer(self, i: int) -> tuple[jax.Array, jax.Array]:
    """Layer ``i``'s (keys, values) buffers, for :func:`write_and_attend`."""
    return self.k[i], self.v[i]

  def advance(self, layers: list, tokens: int, start: jax.Array) -> "KVCache":
    """The cache after a call of ``tokens`` tokens that wrote ``layers`` (each layer's
    buffers from :func:`write_and_attend`)."""
    return KVCache(
      tuple(k for k, _ in layers), tuple(v for _, v in layers), self.index + tokens, start
    )


def init_cache(
  config: ModelConfig, batch: int, length: int, start: jax.Array | None = None, dtype=None
) -> KVCache:
  """An empty cache for ``batch`` rows of up to ``length`` tokens, rows real from ``start``
  [B] on (default 0)."""
  dtype = config.jnp_dtype if dtype is None else dtype
  shape = (batch, config.num_kv_heads, length, config.head_dim)
  kshape = (batch, config.num_kv_heads, config.head_dim, length)
  start = jnp.zeros((batch,), jnp.int32) if start is None else start.astype(jnp.int32)
  zeros = lambda shape: tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers))
  return KVCache(zeros(kshape), zeros(shape), jnp.zeros((), jnp.int32), start)


def write_and_attend(
  buffers: tuple[jax.Array, jax.Array],
  index: jax.Array,
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  mask: jax.Array,
):
  """Writes one layer's ``k``, ``v`` [B, T, K, hd] into its ``buffers`` at ``index`` and
  attends ``q`` [B, T, H, hd] over the whole cache with ``mask`` [B, T, S].

  Returns (attention [B, T, H, hd], updated buffers).
  """
  k_cache, v_cache = buffers
  k_cache = jax.lax.dynamic_update_slice(  # [B, K, hd, S]
    k_cache, jnp.transpose(k, (0, 2, 3, 1)).astype(k_cache.dtype), (0, 0, 0, index)
  )
  v_cache = jax.lax.dynamic_update_slice(
    v_cache, jnp.swapaxes(v, 1, 2).astype(v_cache.dtype), (0, 0, index, 0)
  )
  keys, values = k_cache.astype(q.dtype), v_cache.astype(q.dtype)
  out = attention.grouped_products(q, keys, values, mask, keys_transposed=True)
  return out, (k_cache, v_cache)


def constrain(cache: KVCache) -> KVCache:
  """Cache rows over the batch axes, kv heads over the tensor axis (no-op without an
  activation-sharding context)."""
  constrain = lambda buffers, names: tuple(parallel.constrain(x, names) for x in buffers)
  return cache.replace(
    k=constrain(cache.k, ("batch", "act_kv_heads", None, "act_length")),
    v=constrain(cache.v, ("batch", "act_kv_heads", "act_length", None)),
  )


def grow(cache: KVCache, length: int) -> KVCache:
  """The cache extended with empty positions to hold ``length`` (unchanged if it does)."""
  extra = length - cache.length
  if extra <= 0:
    return cache
  pad = lambda buffers, axis: tuple(
    jnp.pad(x, [(0, extra if i == axis else 0) for i in range(4)]) for x in buffers
  )
  return constrain(cache.replace(k=pad(cache.k, 3), v=pad(cache.v, 2)))


def prefill(
  model, tokens: jax.Array, cache: KVCache, *, layers: tuple, return_routing: bool = False, **route
):
  """The model's cached forward over the prompts ``tokens`` [B, S] into an empty ``cache``:
  an ``LMOutput`` whose ``logits`` [B, S, V] and ``cache`` (holding the S positions) the
  decode loop continues from. ``layers``: ``model.layer_params()``; ``route``: the model's
  ``route_shift`` / ``shift_gates``."""
  return model(tokens, cache=cache, return_routing=return_routing, layers=layers, **route)


def prefill_shared(
  model, prompts: jax.Array, start: jax.Array, group: int, length: int, *, layers: tuple
):
  """:func:`prefill` of ``prompts`` [B, S] whose every ``group`` consecutive rows are the same
  prompt: run once per prompt, its cache and last logits repeated to the group's rows.

  Returns an ``LMOutput`` with ``logits`` [B, 1, V] (the last position's) and a constrained
  cache of ``length`` positions whose rows start at ``start`` [B].
  """
  shared = init_cache(model.config, prompts.shape[0] // group, length, start[::group])
  out = model(prompts[::group], cache=shared, layers=layers)
  rep = lambda buffers: tuple(jnp.repeat(x, group, axis=0) for x in buffers)
  return out._replace(
    logits=jnp.repeat(out.logits[:, -1:], group, axis=0),
    cache=constrain(out.cache.replace(k=rep(out.cache.k), v=rep(out.cache.v), start=start)),
  )


def decode_step(
  model, tokens: jax.Array, cache: KVCache, *, layers: tuple, return_routing: bool = False, **route
):
  """One decode step: feeds ``tokens`` [B] at the cache's next position. Returns an
  ``LMOutput`` with ``logits`` [B, 1, V] and the constrained updated cache (``route``: the
  model's ``route_shift`` / ``shift_gates``)."""
  out = model(tokens[:, None], cache=cache, return_routing=return_routing, layers=layers, **route)
  return out._replace(cache=constrain(out.cache))


def cached_layers(run, h: jax.Array, mask: jax.Array, route, cache: KVCache, layers: tuple):
  """The layers of the model's cached call, a Python loop: layer ``i`` (parameters
  ``layers[i]``) writes its keys and values into its own cache buffers and attends over them
  (:func:`write_and_attend`). ``run(h, p, route, attend)`` is one block (``Decoder._run_block``);
  ``route`` (a ``LayerExtras``) holds the layers' stacked replayed experts, shifts and steering
  vectors, each or None.

  Returns (h, stacked hidden states, MoE extras, each layer's updated buffers).
  """
  buffers, outs = [], []
  for i, p in enumerate(layers):
    attend = functools.partial(write_and_attend, cache.layer(i), cache.index, mask=mask)
    h, state, out = run(h, p, route.layer(i), attend)
    buffers.append(state)
    outs.append(out)
  hidden, extra = jax.tree.map(lambda *a: jnp.stack(a), *outs)
  return h, hidden, extra, buffers
