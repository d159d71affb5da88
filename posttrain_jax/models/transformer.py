"""A flax nnx decoder-only LM of the Llama / Qwen2 / Qwen3 family.

RMSNorm, rotary embeddings (rotate-half layout, as Hugging Face), grouped-query attention,
SwiGLU MLP or a sparse mixture of experts (``config.num_experts > 0``, see ``models/moe.py``:
Qwen3-MoE / Mixtral / Qwen2-MoE, with routing record and replay), optional q/k/v bias (Qwen2),
optional per-head q/k RMSNorm (Qwen3), tied or untied embeddings, explicit head_dim. Layer
parameters are stacked on a leading ``layers`` axis. The full-sequence forward (training,
scoring) scans over them (one compiled block, compile time independent of depth) or, with
``config.unroll_layers``, unrolls the scan. A call with a KV cache (prefill, decoding) loops over
the layers in Python, each layer on its own cache buffer. ``Decoder.grouped`` is the
full-sequence forward of several continuations of each prompt with the prompt computed once
(GRPO's groups: the trainer's shared-prompt forward).

Shapes: ``B`` batch, ``T`` tokens in this call, ``S`` cache length, ``L`` layers, ``D`` width,
``H`` query heads, ``K`` kv heads, ``hd`` head dim, ``F`` MLP width, ``V`` vocabulary.

Left padding: row ``b`` of the batch is real from index ``start[b]`` on. Keys before ``start[b]``
are masked and RoPE positions are counted from ``start[b]``, so a left-padded prompt computes the
same logits as the unpadded one.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from flax import struct

from posttrain_jax import parallel
from posttrain_jax.models import moe
from posttrain_jax.models.ops import dense
from posttrain_jax.models.config import ModelConfig

_NEG_INF = -1e30
# Logical names of the residual stream [B, T, D] at block boundaries (parallel.constrain: a
# sharding constraint under an activation_sharding context, the identity without one).
_RESIDUAL = ("batch", "act_length", "act_embed")


@struct.dataclass
class KVCache:
  """Preallocated key/value cache, one buffer per layer.

  Attributes:
    k: L arrays [B, K, hd, S] of keys, transposed: a decode step's scores are one batched
      ``[G, hd] x [hd, S]`` product per (row, kv head) whose output axis S is the buffer's
      minor one (see :func:`attention`). One buffer per layer, so a layer's attention reads
      and updates its own buffer in place; slicing one layer out of a stacked [L, ...] cache
      copied it on every decode step (~20% of a long decode).
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


def init_cache(config: ModelConfig, batch: int, length: int, start: jax.Array | None = None,
               dtype=None) -> KVCache:
  """An empty cache for ``batch`` rows of up to ``length`` tokens."""
  dtype = config.jnp_dtype if dtype is None else dtype
  shape = (batch, config.num_kv_heads, length, config.head_dim)
  kshape = (batch, config.num_kv_heads, config.head_dim, length)
  start = jnp.zeros((batch,), jnp.int32) if start is None else start.astype(jnp.int32)
  zeros = lambda shape: tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers))
  return KVCache(zeros(kshape), zeros(shape), jnp.zeros((), jnp.int32), start)


class LMOutput(NamedTuple):
  """``logits`` [B, T, V] float32 ([B, T, output_dim] for a non-LM head); ``cache`` (or None); ``hidden_states`` [L+1, B, T, D] or None.

  ``hidden_states[0]`` is the embedding output and ``hidden_states[i]`` the residual stream after
  layer ``i`` (before the final norm), as Hugging Face's ``output_hidden_states`` orders them.

  Mixture-of-experts models also fill ``aux_loss`` (float32 scalar, the unweighted
  load-balancing loss over this call's real tokens, see ``moe.load_balancing_loss``; a train step
  adds ``config.router_aux_loss_coef * aux_loss``) and, when asked (``return_routing=True``),
  ``routing`` [L, B, T, k] int32: the experts each token was sent to in each layer (the replayed
  ones under replay). Dense models leave both None.
  """
  logits: jax.Array
  cache: KVCache | None
  hidden_states: jax.Array | None
  aux_loss: jax.Array | None = None
  routing: jax.Array | None = None


def _normal(stddev: float):
  """``jax.nn.initializers.normal(stddev)``, with the draw kept apart from the scaling: under
  ``jit`` (:func:`init_decoder`) XLA would otherwise fuse the multiply into the sampling's
  arithmetic and round the result differently (an ulp) from the eager build."""
  def init(key, shape, dtype=jnp.float32):
    return jax.lax.optimization_barrier(jax.random.normal(key, shape, dtype)) * stddev
  return init


def _param(key, init, shape, names, dtype) -> nnx.Param:
  """A parameter carrying logical axis names (sharded later by a role's rule table)."""
  return nnx.Param(init(key, shape, dtype), out_sharding=names, eager_sharding=False)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  """RMSNorm over the last axis, computed in float32, returned in ``x.dtype``."""
  xf = x.astype(jnp.float32)
  y = xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + eps)
  return (y * weight.astype(jnp.float32)).astype(x.dtype)


def rope_inv_freq(config: ModelConfig) -> jax.Array:
  """[hd/2] inverse frequencies θ^(-2i/hd), scaled as ``config.rope_type`` says.

  'linear' divides every frequency by the factor. 'llama3' (Llama 3.1, as Hugging Face's
  ``_compute_llama3_parameters``): with wavelength λ = 2π/f, original context C, factor s and
  low/high frequency factors a < b, frequencies with λ < C/b are kept, those with λ > C/a are
  divided by s, and in between f' = (1-γ) f/s + γ f with γ = (C/λ - a)/(b - a).
  """
  exponent = jnp.arange(0, config.head_dim, 2, dtype=jnp.float32) / config.head_dim
  inv_freq = 1.0 / (config.rope_theta ** exponent)
  if config.rope_type == "linear":
    inv_freq = inv_freq / config.rope_factor
  elif config.rope_type == "llama3":
    factor, low, high = (config.rope_factor, config.rope_low_freq_factor,
                         config.rope_high_freq_factor)
    context = config.rope_original_max_len
    wavelen = 2 * jnp.pi / inv_freq
    scaled = jnp.where(wavelen > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= context / high) & (wavelen <= context / low)
    inv_freq = jnp.where(medium, smoothed, scaled)
  return inv_freq


def rope_tables(positions: jax.Array, inv_freq: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(cos, sin), each [B, T, 1, hd] float32, of RoPE at ``positions`` [B, T] int.

  Built once per forward and shared by every layer's q and k.
  """
  angles = positions.astype(jnp.float32)[..., None] * inv_freq          # [B, T, hd/2]
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]    # [B, T, 1, hd]
  return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotate-half RoPE of ``x`` [B, T, N, hd] with :func:`rope_tables` ``cos``, ``sin``."""
  xf = x.astype(jnp.float32)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
  return (xf * cos + rotated * sin).astype(x.dtype)


class Layers(nnx.Module):
  """All decoder blocks' parameters, stacked on a leading ``layers`` axis."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    c, pd = config, config.jnp_param_dtype
    L, D, H, K, hd, F = (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
                         c.mlp_dim)
    ones = jax.nn.initializers.ones
    zeros = jax.nn.initializers.zeros
    def dense(in_axis, out_axis):
      return jax.nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal",
                                                  in_axis=in_axis, out_axis=out_axis,
                                                  batch_axis=0)
    self.attn_norm = _param(rngs.params(), ones, (L, D), ("layers", "norm"), pd)
    self.q = _param(rngs.params(), dense(1, (2, 3)), (L, D, H, hd),
                    ("layers", "embed", "heads", "head_dim"), pd)
    self.k = _param(rngs.params(), dense(1, (2, 3)), (L, D, K, hd),
                    ("layers", "embed", "kv_heads", "head_dim"), pd)
    self.v = _param(rngs.params(), dense(1, (2, 3)), (L, D, K, hd),
                    ("layers", "embed", "kv_heads", "head_dim"), pd)
    self.o = _param(rngs.params(), dense((1, 2), 3), (L, H, hd, D),
                    ("layers", "heads", "head_dim", "embed"), pd)
    # Optional parameters are assigned once (nnx fixes an attribute's kind at first assignment).
    bias = c.qkv_bias
    self.q_bias = (_param(rngs.params(), zeros, (L, H, hd), ("layers", "heads", "head_dim"), pd)
                   if bias else None)
    self.k_bias = (_param(rngs.params(), zeros, (L, K, hd), ("layers", "kv_heads", "head_dim"),
                          pd) if bias else None)
    self.v_bias = (_param(rngs.params(), zeros, (L, K, hd), ("layers", "kv_heads", "head_dim"),
                          pd) if bias else None)
    self.q_norm = (_param(rngs.params(), ones, (L, hd), ("layers", "head_dim"), pd)
                   if c.qk_norm else None)
    self.k_norm = (_param(rngs.params(), ones, (L, hd), ("layers", "head_dim"), pd)
                   if c.qk_norm else None)
    self.mlp_norm = _param(rngs.params(), ones, (L, D), ("layers", "norm"), pd)
    sparse = c.num_experts > 0
    self.gate = (None if sparse else
                 _param(rngs.params(), dense(1, 2), (L, D, F), ("layers", "embed", "mlp"), pd))
    self.up = (None if sparse else
               _param(rngs.params(), dense(1, 2), (L, D, F), ("layers", "embed", "mlp"), pd))
    self.down = (None if sparse else
                 _param(rngs.params(), dense(1, 2), (L, F, D), ("layers", "mlp", "embed"), pd))
    # Mixture of experts (all layers sparse): router, stacked experts, optional shared expert.
    specs = moe.param_specs(c) if sparse else {}
    for name in moe.PARAM_NAMES:
      shape, names, init = specs.get(name, (None, None, None))
      setattr(self, name, None if shape is None else
              _param(rngs.params(), init, shape, names, pd))

  def stacked(self, dtype) -> dict[str, jax.Array]:
    """The present parameters as plain arrays in the compute dtype, keyed by name (the router
    keeps its parameter dtype: routing is computed in float32)."""
    names = ("attn_norm", "q", "k", "v", "o", "q_bias", "k_bias", "v_bias", "q_norm", "k_norm",
             "mlp_norm", "gate", "up", "down") + moe.PARAM_NAMES
    return {n: getattr(self, n)[...] if n == "router" else getattr(self, n)[...].astype(dtype)
            for n in names if getattr(self, n) is not None}


def _attention_mask(start: jax.Array, offset: jax.Array, t: int, s: int) -> jax.Array:
  """[B, T, S] bool: causal over absolute positions and no key before the row's start."""
  q_idx = offset + jnp.arange(t)                      # [T]
  k_idx = jnp.arange(s)                               # [S]
  causal = k_idx[None, :] <= q_idx[:, None]           # [T, S]
  real = k_idx[None, :] >= start[:, None]             # [B, S]
  return causal[None] & real[:, None, :]


def attention(q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array, *,
              cached: bool, causal_block: int = 0) -> jax.Array:
  """Grouped-query softmax attention (scores and softmax in float32) -> [B, T, H, hd].

  ``q`` [B, T, H, hd]; with the cache (``cached``) ``keys`` [B, K, hd, S] and ``values``
  [B, K, S, hd] (the KVCache layout), else both [B, S, K, hd] (the projections as they come);
  ``mask`` [B, T, S] bool.

  Two formulations, each the faster one on XLA:CPU where it is used: with the cache (prefill
  and decode), both products are batched over (B, K) with a group's query heads and the T
  queries folded into one row axis, and contract canonically (``[M, hd] x [hd, S]`` then
  ``[M, S] x [S, hd]``; :func:`_grouped_products`). Without a cache (training, scoring) the
  einsum below was 3-5% faster for the forward and backward pass (tiny model, 64 rows).
  The cache holds the keys transposed so that the decode step's score product reads them
  with S minor. In-process sampler A/Bs on the 2-core AMD machine (same tokens and
  log-probs): small model, T = 128, 8.10 -> 7.54 s and 8.18 -> 7.79 s; tiny, T = 16,
  36.8 -> 33.6 ms; T = 512, 2.96 -> 2.84 s, against keys stored [B, K, S, hd] and the decode
  step's products formed as multiply-reduce loop fusions (which had beaten batched matmul
  calls on that layout on the earlier Intel machine: small, T = 128, 5.33 -> 5.04 s; here
  batched calls on that layout were slower still, 8.8 -> 9.8 s).

  ``causal_block`` > 0 (full causal forward only: ``mask`` causal, the T queries being the
  last T of the S keys): queries in blocks of this many attend only to the keys up to their
  block's end, skipping
  the upper triangle of the score matrix (about half of it for long T). At T = 271 this ran
  one layer's attention forward and backward ~2x faster (64-query blocks). Exact for every
  query with at least one unmasked key; a query with none (left padding before a row's start)
  averages fewer masked values instead, and no real position reads it.
  """
  B, T, H, hd = q.shape
  if causal_block and not cached and T > causal_block:
    # Keys and values transposed once to [B, K, S, hd], whose products each block uses
    # (re-transposing every block's key prefix cost more: T = 512, 152 -> 114 ms forward; keys
    # as the cache holds them, [B, K, hd, S], slowed the small update, 13.9 -> 14.6 s).
    # ``off`` keys precede the first query (a shared prompt's keys, see Decoder.grouped).
    off = keys.shape[1] - T
    keys, values = jnp.swapaxes(keys, 1, 2), jnp.swapaxes(values, 1, 2)
    outs = []
    for s in range(0, T, causal_block):
      e = min(T, s + causal_block)
      outs.append(_grouped_products(q[:, s:e], keys[:, :, :off + e], values[:, :, :off + e],
                                    mask[:, s:e, :off + e], keys_transposed=False))
    return jnp.concatenate(outs, axis=1)
  if cached:
    return _grouped_products(q, keys, values, mask, keys_transposed=True)
  K = keys.shape[2]
  G = H // K
  qg = q.reshape(B, T, K, G, hd)
  scores = jnp.einsum("btkgh,bskh->bkgts", qg, keys).astype(jnp.float32) * hd ** -0.5
  scores = jnp.where(mask[:, None, None], scores, _NEG_INF)
  probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
  return jnp.einsum("bkgts,bskh->btkgh", probs, values).reshape(B, T, H, hd)


def _grouped_products(q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array, *,
                      keys_transposed: bool) -> jax.Array:
  """:func:`attention` as two products batched over (B, K): ``q`` [B, T, H, hd], ``keys``
  [B, K, hd, S] (``keys_transposed``, the cache layout) or [B, K, S, hd], ``values``
  [B, K, S, hd], ``mask`` [B, T, S] -> [B, T, H, hd]."""
  B, T, H, hd = q.shape
  K = keys.shape[1]
  G = H // K
  scale = hd ** -0.5
  qg = jnp.transpose(q.reshape(B, T, K, G, hd), (0, 2, 3, 1, 4)).reshape(B, K, G * T, hd)
  batch = ((0, 1), (0, 1))
  contract = 2 if keys_transposed else 3
  scores = jax.lax.dot_general(qg, keys, (((3,), (contract,)), batch)).astype(jnp.float32)
  scores = scores.reshape(B, K, G, T, -1) * scale
  scores = jnp.where(mask[:, None, None], scores, _NEG_INF)
  probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype).reshape(B, K, G * T, -1)
  out = jax.lax.dot_general(probs, values, (((3,), (2,)), batch))          # [B, K, G*T, hd]
  return jnp.transpose(out.reshape(B, K, G, T, hd), (0, 3, 1, 2, 4)).reshape(B, T, H, hd)


def _block(config: ModelConfig, p: dict, h: jax.Array, rope: tuple, mask: jax.Array,
           kv: tuple | None, index: jax.Array,
           token_mask: jax.Array | None = None, replay: jax.Array | None = None):
  """One decoder block.

  Returns (h [B, T, D], updated (k_cache, v_cache) or None, MoE extras or None); the extras of
  a sparse block are (experts [B, T, k] int32, moe.LayerStats), given ``token_mask`` [B, T]
  (tokens the load-balancing loss counts) and optionally ``replay`` [B, T, k] (recorded experts).
  """
  c = config
  q, k, v = _qkv(c, p, h, rope)
  if kv is not None:
    k_cache, v_cache = kv                                           # this layer's buffers
    k_cache = jax.lax.dynamic_update_slice(                         # [B, K, hd, S]
        k_cache, jnp.transpose(k, (0, 2, 3, 1)).astype(k_cache.dtype), (0, 0, 0, index))
    v_cache = jax.lax.dynamic_update_slice(
        v_cache, jnp.swapaxes(v, 1, 2).astype(v_cache.dtype), (0, 0, index, 0))
    keys, values = k_cache.astype(h.dtype), v_cache.astype(h.dtype)
    kv = (k_cache, v_cache)
  else:
    keys, values = k, v
  attn = attention(q, keys, values, mask, cached=kv is not None,
                   causal_block=c.causal_block)
  h = h + dense(attn, p["o"], 2)
  if c.num_experts:
    x = rms_norm(h, p["mlp_norm"], c.rms_norm_eps)
    y, experts, stats = moe.moe_mlp(c, p, x, mask=token_mask, replay=replay)
    return h + y, kv, (experts, stats)
  return _mlp(c, p, h), kv, None


def fuse_projections(p: dict) -> dict:
  """One layer's parameters with the projections of a shared input fused for decoding:
  ``qkv`` [D, K, G+2, hd] (each kv head's G query heads, then its key and value) and
  ``gate_up`` [D, F, 2] replace q/k/v and gate/up, so a decode step runs one matmul for each
  pair instead of three and two. At the 64 rows of a decode step the fused gate/up matmul ran
  13-20% faster than the two (small model's shape, [64, 512] x [512, 2048]); for training's
  thousands of rows it made no difference, so only the cached (decode) path uses it, built once
  per sampler call. The kv-head (resp. mlp) axis stays the leading output axis, so a tensor-
  parallel split of heads or of the MLP splits the fused weight the same way."""
  p = dict(p)
  if all(n in p for n in ("q", "k", "v")):
    D, H, hd = p["q"].shape
    K = p["k"].shape[1]
    q = p.pop("q").reshape(D, K, H // K, hd)
    p["qkv"] = jnp.concatenate([q, p.pop("k")[:, :, None], p.pop("v")[:, :, None]], axis=2)
  if "gate" in p and "up" in p:
    p["gate_up"] = jnp.stack([p.pop("gate"), p.pop("up")], axis=-1)
  return p


def _qkv(c: ModelConfig, p: dict, h: jax.Array, rope: tuple):
  """The attention input of a block: normed ``h`` [B, T, D] -> q [B, T, H, hd], k and v
  [B, T, K, hd] (biases, q/k norms and RoPE applied)."""
  x = rms_norm(h, p["attn_norm"], c.rms_norm_eps)
  if "qkv" in p:
    y = dense(x, p["qkv"])                                          # [B, T, K, G+2, hd]
    B, T, K, G2, hd = y.shape
    q, k, v = y[:, :, :, :G2 - 2].reshape(B, T, K * (G2 - 2), hd), y[:, :, :, -2], y[:, :, :, -1]
  else:
    q = dense(x, p["q"])
    k = dense(x, p["k"])
    v = dense(x, p["v"])
  if "q_bias" in p:
    q, k, v = q + p["q_bias"], k + p["k_bias"], v + p["v_bias"]
  if "q_norm" in p:
    q = rms_norm(q, p["q_norm"], c.rms_norm_eps)
    k = rms_norm(k, p["k_norm"], c.rms_norm_eps)
  return apply_rope(q, *rope), apply_rope(k, *rope), v


def _mlp(c: ModelConfig, p: dict, h: jax.Array) -> jax.Array:
  """The residual SwiGLU MLP of a dense block: ``h + down(silu(gate x) * up x)``."""
  x = rms_norm(h, p["mlp_norm"], c.rms_norm_eps)
  if "gate_up" in p:
    y = dense(x, p["gate_up"])                                      # [B, T, F, 2]
    return h + dense(jax.nn.silu(y[..., 0]) * y[..., 1], p["down"])
  return h + dense(jax.nn.silu(dense(x, p["gate"])) * dense(x, p["up"]), p["down"])


def _grouped_block(c: ModelConfig, p: dict, h: jax.Array, rope: tuple, mask_p: jax.Array,
                   mask_c: jax.Array, prompt_len: int, group: int):
  """One dense block of :meth:`Decoder.grouped` on the joined residual stream ``h``
  [P, S + group*T, D]: prompt ``i``'s S positions followed by its ``group`` completion rows'
  T positions each.

  The projections and the MLP run on all positions at once (one matmul per weight: separate
  calls for the prompt rows and the completion rows cost ~8% of the tiny update in call
  overhead, small-M efficiency and the copies between them). Only attention sees two parts:
  the prompts attend causally to themselves; each completion row attends to its prompt's keys
  (computed once, repeated to the group's rows) and causally to its own. Joining along the
  position axis of each prompt keeps the rows' sharding: rows ``i*group .. (i+1)*group - 1``
  of the completions belong to prompt ``i``, so the reshapes move no row across shards."""
  P, S = h.shape[0], prompt_len
  T = (h.shape[1] - S) // group
  B = P * group
  q, k, v = _qkv(c, p, h, rope)
  split = lambda x: (x[:, :S], x[:, S:].reshape(B, T, *x.shape[2:]))
  (qp, qc), (kp, kc), (vp, vc) = split(q), split(k), split(v)
  ap = attention(qp, kp, vp, mask_p, cached=False, causal_block=c.causal_block)
  keys = jnp.concatenate([jnp.repeat(kp, group, axis=0), kc], axis=1)     # [B, S+T, K, hd]
  values = jnp.concatenate([jnp.repeat(vp, group, axis=0), vc], axis=1)
  ac = attention(qc, keys, values, mask_c, cached=False, causal_block=c.causal_block)
  a = _join(ap, ac, group)
  return _mlp(c, p, h + dense(a, p["o"], 2))


def _join(prompt_part: jax.Array, completion_part: jax.Array, group: int) -> jax.Array:
  """``[P, S, ...]`` and ``[P*group, T, ...]`` -> ``[P, S + group*T, ...]`` (see
  :func:`_grouped_block`)."""
  P = prompt_part.shape[0]
  rest = completion_part.shape[2:]
  return jnp.concatenate(
      [prompt_part, completion_part.reshape(P, group * completion_part.shape[1], *rest)], axis=1)


def init_decoder(config: ModelConfig, seed: int) -> tuple[nnx.GraphDef, nnx.State]:
  """``(graphdef, params)`` of a freshly initialised :class:`Decoder`, made by one compiled
  program. Building the module eagerly runs each initializer as its own small program (~15
  compilations on a cold start, ~15 cache reads on a rerun); here it is one of each (tiny, no
  cache: median 1.84 s against 2.17 s eagerly, README "Speed"). The parameters equal those of
  ``Decoder(config, rngs=nnx.Rngs(params=seed))`` bit for bit (tested; see :func:`_normal`),
  so a seed gives the same model either way."""
  def make():
    return nnx.split(Decoder(config, rngs=nnx.Rngs(params=seed)))[1]
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(params=seed))))
  return graphdef, jax.jit(make)()


class Decoder(nnx.Module):
  """Decoder-only causal LM. ``model(tokens)`` returns an :class:`LMOutput` (logits first)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    pd = config.jnp_param_dtype
    self.embed = _param(rngs.params(), _normal(0.02),
                        (config.vocab_size, config.hidden_size), ("vocab", "embed"), pd)
    self.layers = Layers(config, rngs=rngs)
    self.final_norm = _param(rngs.params(), jax.nn.initializers.ones, (config.hidden_size,),
                             ("norm",), pd)
    self.lm_head = (None if config.tied else
                    _param(rngs.params(), _normal(0.02),
                           (config.hidden_size, config.head_dim_out), ("embed", "vocab"), pd))

  def layer_params(self) -> tuple[dict, ...]:
    """Each layer's parameters (compute dtype), sliced out of the stacked ones, with the
    projections that read the same input fused (:func:`fuse_projections`): ``layers=`` of a
    cached call."""
    stacked = self.layers.stacked(self.config.jnp_dtype)
    return tuple(fuse_projections({n: w[i] for n, w in stacked.items()})
                 for i in range(self.config.num_layers))

  def __call__(self, tokens: jax.Array, *, start: jax.Array | None = None,
               positions: jax.Array | None = None, cache: KVCache | None = None,
               return_hidden_states: bool = False, routing: jax.Array | None = None,
               return_routing: bool = False, layers: tuple | None = None,
               token_mask: jax.Array | None = None) -> LMOutput:
    """Runs the model.

    Args:
      tokens: [B, T] int32 token ids.
      start: [B] int32 first real index of each row (left padding); default 0, or the cache's.
      positions: [B, T] int32 RoPE positions; default ``max(index - start, 0)``.
      cache: a KVCache to read and extend (decoding), or None (full causal forward).
      return_hidden_states: also return the residual stream of every layer.
      routing: MoE only: [L, B, T, k] int32 experts to replay for these tokens (routing replay,
        R3): each token uses these experts, weighted by the current router's gates restricted
        to them; a (layer, token) whose ids are not all in [0, E) (e.g. -1) is routed afresh.
      return_routing: MoE only: also return the experts used, ``LMOutput.routing``
        [L, B, T, k] int32 (None for a dense model). With a cache, each call returns its own
        tokens' routing.
      layers: with a cache: the per-layer parameters from :meth:`layer_params`. A decode loop
        passes them, built once before the loop: slicing the stacked parameters inside the
        loop body copied every layer's weights on every step (XLA does not hoist the copies
        out of a while loop), a fifth of the small model's decode time.
      token_mask: MoE only: [B, T] the tokens the load-balancing loss counts (> 0); default:
        every position from the row's start (a trainer passes its completion mask too, so the
        padding after EOS is not counted, as Hugging Face's attention mask does).

    Returns:
      LMOutput(logits [B, T, V] float32, updated cache or None, hidden states or None,
      aux_loss (MoE: float32 load-balancing loss over the real tokens) or None,
      routing or None).
    """
    c = self.config
    B, T = tokens.shape
    if routing is not None:
      want = (c.num_layers, B, T, c.num_experts_per_tok)
      if not c.num_experts:
        raise ValueError("routing replay needs a mixture-of-experts model (num_experts > 0)")
      if tuple(routing.shape) != want:
        raise ValueError(f"routing has shape {tuple(routing.shape)}, expected [L, B, T, k] = "
                         f"{list(want)}")
    dtype = c.jnp_dtype
    if cache is not None:
      start = cache.start if start is None else start
      offset, S = cache.index, cache.length
    else:
      offset, S = jnp.zeros((), jnp.int32), T
    start = jnp.zeros((B,), jnp.int32) if start is None else start.astype(jnp.int32)
    if positions is None:
      positions = jnp.maximum(offset + jnp.arange(T)[None, :] - start[:, None], 0)
    mask = _attention_mask(start, offset, T, S)
    rope = rope_tables(positions, rope_inv_freq(c))
    embed = self.embed[...].astype(dtype)
    h = parallel.constrain(embed_lookup(embed, tokens), _RESIDUAL)
    params = self.layers.stacked(dtype) if layers is None or cache is None else None
    # Tokens the load-balancing loss counts: real (not left padding) positions.
    real = ((offset + jnp.arange(T))[None, :] >= start[:, None]).astype(jnp.float32)
    token_mask = real if token_mask is None else real * (token_mask > 0).astype(jnp.float32)

    def body(carry, xs):
      h, kv = carry
      p, replay = xs
      h, kv, extra = _block(c, p, h, rope, mask, kv, offset, token_mask=token_mask,
                            replay=replay)
      h = parallel.constrain(h, _RESIDUAL)
      return (h, kv), (h if return_hidden_states else None, extra)

    if c.remat:
      body = jax.checkpoint(body, prevent_cse=False)
    if cache is None:
      unroll = c.num_layers if c.unroll_layers else 1
      (h, _), (hidden, extra) = jax.lax.scan(body, (h, None), (params, routing), unroll=unroll)
      kv = None
    else:
      # With a cache the layers run as a Python loop, each on its own cache buffer and on
      # static (loop-invariant) slices of the stacked parameters.
      keys, values, outs = [], [], []
      for i in range(c.num_layers):
        p_i = layers[i] if params is None else jax.tree.map(lambda a: a[i], params)
        xs = (p_i, None if routing is None else routing[i])
        (h, (k_i, v_i)), out_i = body((h, (cache.k[i], cache.v[i])), xs)
        keys.append(k_i)
        values.append(v_i)
        outs.append(out_i)
      kv = (tuple(keys), tuple(values))
      hidden, extra = jax.tree.map(lambda *a: jnp.stack(a), *outs) if outs else (None, None)
    aux_loss = used = None
    if extra is not None:
      used, stats = extra
      aux_loss = moe.load_balancing_loss(stats)
      used = used if return_routing else None
    if return_hidden_states:
      hidden = jnp.concatenate([jnp.take(embed, tokens, axis=0)[None], hidden], axis=0)
    out = rms_norm(h, self.final_norm[...], c.rms_norm_eps)
    head = embed.T if self.lm_head is None else self.lm_head[...].astype(dtype)
    logits = dense(out, head).astype(jnp.float32)
    logits = parallel.constrain(logits, ("batch", "act_length", "act_vocab"))
    new_cache = None
    if cache is not None:
      new_cache = KVCache(kv[0], kv[1], cache.index + T, start)
    return LMOutput(logits, new_cache, hidden, aux_loss, used)

  def grouped(self, prompts: jax.Array, prompt_start: jax.Array, completions: jax.Array,
              group: int) -> LMOutput:
    """The forward of ``group`` continuations of each prompt, the prompt computed once.

    Row ``b`` of the batch is ``prompts[b // group]`` followed by ``completions[b]``; the
    result equals the full forward over those concatenated rows (``self(concat, start=
    repeat(prompt_start, group))``) at positions ``S-1 .. S+T-1``: the prompt's last position
    (predicting the first completion token) and every completion position. The prompt's
    layers run on ``P`` rows instead of ``P * group`` (their keys and values are repeated to
    the group's rows; gradients flow back through the repeat as sums), so a batch of short
    completions after a shared prompt costs about ``(P*S + B*T) / (B*(S+T))`` of the full
    forward. Dense models only (a mixture of experts counts every row's prompt tokens in its
    load-balancing loss).

    Args:
      prompts: [P, S] int32 prompt tokens, left-padded.
      prompt_start: [P] int32 first real index of each prompt.
      completions: [P*group, T] int32 tokens after the prompt (T may be 0).
      group: rows per prompt.

    Returns:
      LMOutput(logits [P*group, T+1, V] float32, None, None).
    """
    c = self.config
    if c.num_experts:
      raise ValueError("Decoder.grouped (the shared-prompt forward) supports dense models only; "
                       "run the full forward (e.g. config.rl.shared_prefix=False)")
    P, S = prompts.shape
    B, T = completions.shape
    if group < 1 or B != P * group:
      raise ValueError(f"grouped forward: {B} completion rows are not {group} per each of "
                       f"{P} prompts")
    dtype = c.jnp_dtype
    prompt_start = prompt_start.astype(jnp.int32)
    row_start = jnp.repeat(prompt_start, group)
    inv_freq = rope_inv_freq(c)
    rope_p = rope_tables(jnp.maximum(jnp.arange(S)[None, :] - prompt_start[:, None], 0),
                         inv_freq)
    rope_c = rope_tables(jnp.maximum(S + jnp.arange(T)[None, :] - row_start[:, None], 0),
                         inv_freq)
    mask_p = _attention_mask(prompt_start, jnp.zeros((), jnp.int32), S, S)       # [P, S, S]
    mask_c = _attention_mask(row_start, jnp.asarray(S, jnp.int32), T, S + T)     # [B, T, S+T]
    embed = self.embed[...].astype(dtype)
    rope = tuple(_join(a, b, group) for a, b in zip(rope_p, rope_c))
    h = embed_lookup(embed, _join(prompts, completions.astype(prompts.dtype), group))
    h = parallel.constrain(h, _RESIDUAL)                                  # [P, S+group*T, D]

    def body(h, p):
      h = _grouped_block(c, p, h, rope, mask_p, mask_c, S, group)
      return parallel.constrain(h, _RESIDUAL), None

    if c.remat:
      body = jax.checkpoint(body, prevent_cse=False)
    unroll = c.num_layers if c.unroll_layers else 1
    h, _ = jax.lax.scan(body, h, self.layers.stacked(dtype), unroll=unroll)
    hp, hc = h[:, :S], h[:, S:].reshape(B, T, h.shape[-1])
    h = jnp.concatenate([jnp.repeat(hp[:, -1:], group, axis=0), hc], axis=1)  # [B, T+1, D]
    out = rms_norm(h, self.final_norm[...], c.rms_norm_eps)
    head = embed.T if self.lm_head is None else self.lm_head[...].astype(dtype)
    logits = dense(out, head).astype(jnp.float32)
    logits = parallel.constrain(logits, ("batch", "act_length", "act_vocab"))
    return LMOutput(logits, None, None)


# Vocabularies up to this size take the embedding gradient as a one-hot matmul.
ONE_HOT_EMBED_VOCAB = 512


@jax.custom_vjp
def _one_hot_grad_lookup(embed: jax.Array, tokens: jax.Array) -> jax.Array:
  return jnp.take(embed, tokens, axis=0)


def _lookup_fwd(embed, tokens):
  return jnp.take(embed, tokens, axis=0), (tokens, embed.shape[0])


def _lookup_bwd(res, g):
  tokens, vocab = res
  one_hot = jax.nn.one_hot(tokens.reshape(-1), vocab, dtype=g.dtype)       # [N, V]
  grad = jnp.dot(one_hot.T, g.reshape(-1, g.shape[-1]),
                 precision=jax.lax.Precision.HIGHEST)                       # exact sums
  return grad, None


_one_hot_grad_lookup.defvjp(_lookup_fwd, _lookup_bwd)


def embed_lookup(embed: jax.Array, tokens: jax.Array) -> jax.Array:
  """``embed[tokens]``; for a small vocabulary (<= ``ONE_HOT_EMBED_VOCAB``) the gradient is a
  one-hot matmul ``one_hot(tokens).T @ g`` instead of the scatter-add XLA:CPU runs as a loop
  over every token (a while loop of B*T iterations per step)."""
  if embed.shape[0] > ONE_HOT_EMBED_VOCAB:
    return jnp.take(embed, tokens, axis=0)
  return _one_hot_grad_lookup(embed, tokens)


def gather_logprobs(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """log softmax(logits)[targets] in float32: ``[B, T, V], [B, T] -> [B, T]``."""
  logits = logits.astype(jnp.float32)
  picked = jnp.sum(jnp.where(jnp.arange(logits.shape[-1]) == targets[..., None], logits, 0.0),
                   axis=-1)
  return picked - jax.nn.logsumexp(logits, axis=-1)
