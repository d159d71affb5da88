"""The reference decoder: a flax nnx decoder-only LM of the Llama / Qwen2 / Qwen3 family.

RMSNorm, rotary embeddings (rotate-half layout, as Hugging Face), grouped-query attention,
SwiGLU MLP or a sparse mixture of experts (``config.num_experts > 0``, ``models/moe.py``),
optional q/k/v bias (Qwen2), optional per-head q/k RMSNorm (Qwen3), tied or untied embeddings,
explicit head_dim. Layer parameters are stacked on a leading ``layers`` axis.

``Decoder.__call__`` without a cache is the full causal forward (training, scoring): a
``lax.scan`` of :func:`_block` over the stacked layers. With a cache (prefill, decoding) it
runs the layers in a Python loop (``decode_cache.cached_layers``). The fast paths live beside
this file, each with an equality test against the reference: the cache layout
(``decode_cache.py``), attention kernels (``attention.py``), fused projections (``fused.py``),
the shared-prompt forward (``grouped.py``) and the embedding gradient (``custom_grad.py``);
speed figures are in ``docs/performance_models.md``.

Shapes: ``B`` batch, ``T`` tokens in this call, ``S`` keys (cache length, or T), ``L`` layers,
``D`` width, ``H`` query heads, ``K`` kv heads, ``G = H/K``, ``hd`` head dim, ``F`` MLP width,
``V`` vocabulary.

Left padding: row ``b`` is real from index ``start[b]`` on. Keys before ``start[b]`` are
masked and RoPE positions count from ``start[b]``, so a left-padded prompt computes the same
logits as the unpadded one.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from posttrain_jax import parallel
from posttrain_jax.models import attention as attention_lib
from posttrain_jax.models import decode_cache, fused, moe
from posttrain_jax.models.config import ModelConfig, scale_rope_frequencies
from posttrain_jax.models.custom_grad import embed_lookup
from posttrain_jax.models.decode_cache import KVCache
from posttrain_jax.models.ops import dense

# Logical names of the residual stream [B, T, D] at block boundaries (parallel.constrain: a
# sharding constraint under an activation_sharding context, the identity without one).
_RESIDUAL = ("batch", "act_length", "act_embed")


class LMOutput(NamedTuple):
  """``logits`` [B, T, V] float32 ([B, T, output_dim] for a non-LM head); ``cache`` (or None);
  ``hidden_states`` [L+1, B, T, D] or None: the embedding output, then the residual stream after
  each layer (before the final norm), as Hugging Face's ``output_hidden_states``.

  Mixture-of-experts models also fill ``aux_loss`` (float32, the unweighted load-balancing loss
  over this call's real tokens, ``moe.load_balancing_loss``), with ``return_routing=True``,
  ``routing`` [L, B, T, k] int32 (the experts each token used), and with
  ``return_router_inputs=True`` ``router_inputs`` [L, B, T, D] float32 (each layer's normed
  residual the router reads: its logits are ``router_inputs[l] @ router[l]``). Dense models
  leave them None.
  """

  logits: jax.Array
  cache: KVCache | None
  hidden_states: jax.Array | None
  aux_loss: jax.Array | None = None
  routing: jax.Array | None = None
  router_inputs: jax.Array | None = None


def _normal(stddev: float):
  """``jax.nn.initializers.normal(stddev)``, with the draw kept apart from the scaling: under
  ``jit`` (``init.init_decoder``) XLA would otherwise fuse the multiply into the sampling's
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
  """[hd/2] inverse frequencies θ^(-2i/hd), scaled as ``config.rope_type`` says
  (``config.scale_rope_frequencies``)."""
  exponent = jnp.arange(0, config.head_dim, 2, dtype=jnp.float32) / config.head_dim
  return scale_rope_frequencies(config, 1.0 / (config.rope_theta**exponent))


def rope_tables(positions: jax.Array, inv_freq: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(cos, sin), each [B, T, 1, hd] float32, of RoPE at ``positions`` [B, T] int.

  Built once per forward and shared by every layer's q and k.
  """
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, hd/2]
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [B, T, 1, hd]
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
    L, D, H, K, hd, F = (
      c.num_layers,
      c.hidden_size,
      c.num_heads,
      c.num_kv_heads,
      c.head_dim,
      c.mlp_dim,
    )
    ones = jax.nn.initializers.ones
    zeros = jax.nn.initializers.zeros

    def dense(in_axis, out_axis):
      return jax.nn.initializers.variance_scaling(
        1.0, "fan_in", "truncated_normal", in_axis=in_axis, out_axis=out_axis, batch_axis=0
      )

    def new(init, shape, names, present=True):
      return _param(rngs.params(), init, shape, names, pd) if present else None

    q_axes, kv_axes = (
      ("layers", "embed", "heads", "head_dim"),
      ("layers", "embed", "kv_heads", "head_dim"),
    )
    self.attn_norm = new(ones, (L, D), ("layers", "norm"))
    self.q = new(dense(1, (2, 3)), (L, D, H, hd), q_axes)
    self.k = new(dense(1, (2, 3)), (L, D, K, hd), kv_axes)
    self.v = new(dense(1, (2, 3)), (L, D, K, hd), kv_axes)
    self.o = new(dense((1, 2), 3), (L, H, hd, D), ("layers", "heads", "head_dim", "embed"))
    # Optional parameters are assigned once (nnx fixes an attribute's kind at first assignment).
    self.q_bias = new(zeros, (L, H, hd), ("layers", "heads", "head_dim"), c.qkv_bias)
    self.k_bias = new(zeros, (L, K, hd), ("layers", "kv_heads", "head_dim"), c.qkv_bias)
    self.v_bias = new(zeros, (L, K, hd), ("layers", "kv_heads", "head_dim"), c.qkv_bias)
    self.q_norm = new(ones, (L, hd), ("layers", "head_dim"), c.qk_norm)
    self.k_norm = new(ones, (L, hd), ("layers", "head_dim"), c.qk_norm)
    self.mlp_norm = new(ones, (L, D), ("layers", "norm"))
    swiglu = not c.num_experts  # else a mixture of experts (moe.py)
    self.gate = new(dense(1, 2), (L, D, F), ("layers", "embed", "mlp"), swiglu)
    self.up = new(dense(1, 2), (L, D, F), ("layers", "embed", "mlp"), swiglu)
    self.down = new(dense(1, 2), (L, F, D), ("layers", "mlp", "embed"), swiglu)
    # Mixture of experts (all layers sparse): router, stacked experts, optional shared expert.
    specs = {} if swiglu else moe.param_specs(c)
    for name in moe.PARAM_NAMES:
      shape, names, init = specs.get(name, (None, None, None))
      setattr(self, name, new(init, shape, names, shape is not None))

  def stacked(self, dtype) -> dict[str, jax.Array]:
    """The present parameters as plain arrays in the compute dtype, keyed by name (the router
    keeps its parameter dtype: routing is computed in float32)."""
    names = (
      "attn_norm",
      "q",
      "k",
      "v",
      "o",
      "q_bias",
      "k_bias",
      "v_bias",
      "q_norm",
      "k_norm",
      "mlp_norm",
      "gate",
      "up",
      "down",
    ) + moe.PARAM_NAMES
    return {
      n: getattr(self, n)[...] if n == "router" else getattr(self, n)[...].astype(dtype)
      for n in names
      if getattr(self, n) is not None
    }


def attention_mask(start: jax.Array, offset: jax.Array, t: int, s: int) -> jax.Array:
  """[B, T, S] bool: query ``i`` (absolute position ``offset + i``) may read key ``j`` when
  ``j <= offset + i`` (causal) and ``j >= start[b]`` (not left padding)."""
  q_idx = offset + jnp.arange(t)  # [T]
  k_idx = jnp.arange(s)  # [S]
  causal = k_idx[None, :] <= q_idx[:, None]  # [T, S]
  real = k_idx[None, :] >= start[:, None]  # [B, S]
  return causal[None] & real[:, None, :]


def attention(q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array) -> jax.Array:
  """Grouped-query softmax attention: ``q`` [B, T, H, hd], ``keys`` and ``values``
  [B, S, K, hd], ``mask`` [B, T, S] bool -> [B, T, H, hd].

  Query head ``h`` reads kv head ``h // G``. Scores ``q.k / sqrt(hd)`` and the softmax are
  float32; masked keys get -1e30 (a query with no unmasked key averages all values).
  """
  B, T, H, hd = q.shape
  K = keys.shape[2]
  G = H // K
  qg = q.reshape(B, T, K, G, hd)
  scores = jnp.einsum("btkgh,bskh->bkgts", qg, keys).astype(jnp.float32) * hd**-0.5
  scores = jnp.where(mask[:, None, None], scores, attention_lib.NEG_INF)
  probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
  return jnp.einsum("bkgts,bskh->btkgh", probs, values).reshape(B, T, H, hd)


def full_attention(
  config: ModelConfig, q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array
) -> jax.Array:
  """The full forward's attention (shapes of :func:`attention`): :func:`attention`, or the
  fast path ``config`` selects (``attention.implementation``; ``config.causal_block``)."""
  impl = attention_lib.implementation(config)
  if impl != "reference":
    return attention_lib.dot_product_attention(q, keys, values, mask, implementation=impl)
  if config.causal_block and q.shape[1] > config.causal_block:
    return attention_lib.causal_blocks(q, keys, values, mask, config.causal_block)
  return attention(q, keys, values, mask)


def qkv(c: ModelConfig, p: dict, h: jax.Array, rope: tuple):
  """The attention input of a block: normed ``h`` [B, T, D] -> q [B, T, H, hd], k and v
  [B, T, K, hd] (biases, q/k norms and RoPE applied). ``p`` is one layer's parameters, with
  q/k/v fused into ``qkv`` or not (``fused.fuse_projections``)."""
  x = rms_norm(h, p["attn_norm"], c.rms_norm_eps)
  if "qkv" in p:
    q, k, v = fused.qkv(x, p["qkv"])
  else:
    q, k, v = dense(x, p["q"]), dense(x, p["k"]), dense(x, p["v"])
  if "q_bias" in p:
    q, k, v = q + p["q_bias"], k + p["k_bias"], v + p["v_bias"]
  if "q_norm" in p:
    q = rms_norm(q, p["q_norm"], c.rms_norm_eps)
    k = rms_norm(k, p["k_norm"], c.rms_norm_eps)
  return apply_rope(q, *rope), apply_rope(k, *rope), v


def mlp(c: ModelConfig, p: dict, h: jax.Array) -> jax.Array:
  """The residual SwiGLU MLP of a dense block: ``h + down(silu(gate x) * up x)``, ``x`` the
  normed ``h`` [B, T, D]."""
  x = rms_norm(h, p["mlp_norm"], c.rms_norm_eps)
  if "gate_up" in p:
    return h + fused.swiglu(x, p["gate_up"], p["down"])
  return h + dense(jax.nn.silu(dense(x, p["gate"])) * dense(x, p["up"]), p["down"])


class LayerExtras(NamedTuple):
  """What one layer takes besides its parameters: ``steer`` [D], a vector added to the residual
  stream after the block (a steering hook; analysis/); for mixtures of experts ``replay``
  [B, T, k] int32 recorded experts and ``shift`` [D, E] a selection shift (``moe.route``);
  each or None. ``shift_gates`` (static): gates from the shifted logits; ``keep_inputs``
  (static): return the router input. The model's call holds them stacked over the layers."""

  replay: jax.Array | None = None
  shift: jax.Array | None = None
  steer: jax.Array | None = None
  shift_gates: bool = False
  keep_inputs: bool = False

  def layer(self, i) -> "LayerExtras":
    """Layer ``i``'s slice of the stacked arrays."""
    at = lambda x: None if x is None else x[i]
    return self._replace(replay=at(self.replay), shift=at(self.shift), steer=at(self.steer))


def _block(
  c: ModelConfig,
  p: dict,
  h: jax.Array,
  rope: tuple,
  attend,
  token_mask: jax.Array,
  route: LayerExtras,
):
  """One decoder block on the residual stream ``h`` [B, T, D]: attention, then the MLP (or
  the mixture of experts), each added to the residual.

  ``attend(q, k, v)`` -> (attention [B, T, H, hd], its state: the layer's updated cache
  buffers, or None). Returns (h, state, MoE extras or None); a sparse block's extras are
  (experts [B, T, k] int32, moe.LayerStats, the router input [B, T, D] float32 or None), given
  ``token_mask`` [B, T] (tokens the load-balancing loss counts) and ``route``
  (:class:`LayerExtras`: recorded experts, a selection shift; its ``steer`` is added by the
  caller).
  """
  q, k, v = qkv(c, p, h, rope)
  attn, state = attend(q, k, v)
  h = h + dense(attn, p["o"], 2)
  if c.num_experts:
    x = rms_norm(h, p["mlp_norm"], c.rms_norm_eps)
    y, experts, stats = moe.moe_mlp(
      c,
      p,
      x,
      mask=token_mask,
      replay=route.replay,
      shift=route.shift,
      shift_gates=route.shift_gates,
    )
    inputs = x.astype(jnp.float32) if route.keep_inputs else None
    return h + y, state, (experts, stats, inputs)
  return mlp(c, p, h), state, None


class Decoder(nnx.Module):
  """Decoder-only causal LM. ``model(tokens)`` returns an :class:`LMOutput` (logits first)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    pd = config.jnp_param_dtype
    self.embed = _param(
      rngs.params(), _normal(0.02), (config.vocab_size, config.hidden_size), ("vocab", "embed"), pd
    )
    self.layers = Layers(config, rngs=rngs)
    self.final_norm = _param(
      rngs.params(), jax.nn.initializers.ones, (config.hidden_size,), ("norm",), pd
    )
    self.lm_head = (
      None
      if config.tied
      else _param(
        rngs.params(),
        _normal(0.02),
        (config.hidden_size, config.head_dim_out),
        ("embed", "vocab"),
        pd,
      )
    )

  def layer_params(self, fuse: bool = True) -> tuple[dict, ...]:
    """Each layer's parameters (compute dtype), sliced out of the stacked ones once, with
    q/k/v and gate/up fused (``fused.fuse_projections``) unless not ``fuse``: ``layers=`` of
    a cached call."""
    stacked = self.layers.stacked(self.config.jnp_dtype)
    per_layer = ({n: w[i] for n, w in stacked.items()} for i in range(self.config.num_layers))
    return tuple(fused.fuse_projections(p) if fuse else p for p in per_layer)

  def __call__(
    self,
    tokens: jax.Array,
    *,
    start: jax.Array | None = None,
    positions: jax.Array | None = None,
    cache: KVCache | None = None,
    return_hidden_states: bool = False,
    routing: jax.Array | None = None,
    return_routing: bool = False,
    layers: tuple | None = None,
    token_mask: jax.Array | None = None,
    route_shift: jax.Array | None = None,
    shift_gates: bool = False,
    return_router_inputs: bool = False,
    steer: jax.Array | None = None,
  ) -> LMOutput:
    """Runs the model.

    Args:
      tokens: [B, T] int32 token ids.
      start: [B] int32 first real index of each row (left padding); default 0, or the cache's.
      positions: [B, T] int32 RoPE positions; default ``max(index - start, 0)``.
      cache: a KVCache to read and extend (prefill, decoding), or None (full causal forward).
      return_hidden_states: also return the residual stream of every layer.
      routing: MoE only: [L, B, T, k] int32 experts to replay (R3), weighted by the current
        router's gates; a (layer, token) whose ids are not all in [0, E) is routed afresh.
      return_routing: MoE only: also return the experts used (``LMOutput.routing``).
      layers: with a cache: :meth:`layer_params`, built once before a decode loop (XLA does
        not hoist slices of the stacked parameters out of a while loop).
      token_mask: MoE only: [B, T] the tokens the load-balancing loss counts (> 0); default:
        every position from the row's start.
      route_shift: MoE only: [L, D, E] selection shifts: layer ``l`` routes each token to
        ``TopK(g + x route_shift[l])`` (PR2's predicted router, methods/pr2/); gates from the
        unshifted router unless ``shift_gates``. Replayed positions keep their experts.
      shift_gates: MoE only: gates from the shifted logits.
      return_router_inputs: MoE only: also return each layer's router input.
      steer: [L, D] vectors added to the residual stream after each layer's block (a steering
        hook: ``analysis.representations.steering`` makes one with a single non-zero row);
        the layer's hidden state includes it, earlier layers are untouched.

    Returns:
      an :class:`LMOutput`.
    """
    c = self.config
    B, T = tokens.shape
    moe.check_routing(c, routing, B, T)
    moe.check_shift(c, route_shift)
    offset, S = (cache.index, cache.length) if cache is not None else (jnp.zeros((), jnp.int32), T)
    if cache is not None and start is None:
      start = cache.start
    start = jnp.zeros((B,), jnp.int32) if start is None else start.astype(jnp.int32)
    if positions is None:
      positions = jnp.maximum(offset + jnp.arange(T)[None, :] - start[:, None], 0)
    mask = attention_mask(start, offset, T, S)
    rope = rope_tables(positions, rope_inv_freq(c))
    embed = self.embed[...].astype(c.jnp_dtype)
    h = parallel.constrain(embed_lookup(embed, tokens), _RESIDUAL)
    # Tokens the load-balancing loss counts: real (not left padding) positions.
    real = ((offset + jnp.arange(T))[None, :] >= start[:, None]).astype(jnp.float32)
    token_mask = real if token_mask is None else real * (token_mask > 0).astype(jnp.float32)
    run = functools.partial(
      self._run_block, rope=rope, token_mask=token_mask, keep_hidden=return_hidden_states
    )
    if steer is not None and tuple(steer.shape) != (c.num_layers, c.hidden_size):
      raise ValueError(
        f"steer has shape {tuple(steer.shape)}, expected [L, D] = {[c.num_layers, c.hidden_size]}"
      )
    route = LayerExtras(routing, route_shift, steer, shift_gates, return_router_inputs)
    if cache is None:
      h, hidden, extra = self._scan_layers(run, h, mask, route)
      new_cache = None
    else:
      layers = self.layer_params(fuse=False) if layers is None else layers
      h, hidden, extra, buffers = decode_cache.cached_layers(run, h, mask, route, cache, layers)
      new_cache = cache.advance(buffers, T, start)
    aux_loss, used, inputs = moe.model_outputs(extra, return_routing)
    if return_hidden_states:
      hidden = jnp.concatenate([jnp.take(embed, tokens, axis=0)[None], hidden], axis=0)
    return LMOutput(self.head(h, embed), new_cache, hidden, aux_loss, used, inputs)

  def _run_block(
    self,
    h: jax.Array,
    p: dict,
    route: LayerExtras,
    attend,
    *,
    rope: tuple,
    token_mask: jax.Array,
    keep_hidden: bool,
  ):
    """One layer of :meth:`__call__` (recomputed in the backward pass under
    ``config.remat``): (h, attend's state, (h or None, MoE extras)). ``route``: this layer's
    :class:`LayerExtras`."""

    def body(h, p, replay, shift, steer):
      r = route._replace(replay=replay, shift=shift, steer=steer)
      h, state, extra = _block(self.config, p, h, rope, attend, token_mask, r)
      if steer is not None:
        h = h + steer.astype(h.dtype)
      h = parallel.constrain(h, _RESIDUAL)
      return h, state, (h if keep_hidden else None, extra)

    if self.config.remat:
      body = jax.checkpoint(body, prevent_cse=False)
    return body(h, p, route.replay, route.shift, route.steer)

  def _scan_layers(self, run, h: jax.Array, mask: jax.Array, route: LayerExtras):
    """The full forward's layers: a scan over the stacked parameters (unrolled with
    ``config.unroll_layers``) and ``route``'s per-layer arrays. Returns (h, stacked hidden
    states or None, MoE extras)."""
    c = self.config
    attend = lambda q, k, v: (full_attention(c, q, k, v, mask), None)

    def body(h, xs):
      p, replay, shift, steer = xs
      h, _, out = run(h, p, route._replace(replay=replay, shift=shift, steer=steer), attend)
      return h, out

    unroll = c.num_layers if c.unroll_layers else 1
    xs = (self.layers.stacked(c.jnp_dtype), route.replay, route.shift, route.steer)
    h, (hidden, extra) = jax.lax.scan(body, h, xs, unroll=unroll)
    return h, hidden, extra

  def head(self, h: jax.Array, embed: jax.Array) -> jax.Array:
    """Logits [B, T, V] float32 of the residual stream ``h`` [B, T, D]: final norm, then the
    LM head (``embed`` [V, D] transposed when tied)."""
    c = self.config
    out = rms_norm(h, self.final_norm[...], c.rms_norm_eps)
    head = embed.T if self.lm_head is None else self.lm_head[...].astype(c.jnp_dtype)
    logits = dense(out, head).astype(jnp.float32)
    return parallel.constrain(logits, ("batch", "act_length", "act_vocab"))
