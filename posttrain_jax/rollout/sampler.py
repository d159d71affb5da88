"""Jitted sampling: one prefill over the left-padded prompts, then a ``lax.while_loop`` decode.

The loop writes into a preallocated KV cache, stops early once every row has emitted EOS, and
records float32 behaviour log-probs of each sampled token: ``log softmax(logits / τ)`` over the
full vocabulary (τ = 1 for greedy). Top-k / top-p truncation shapes which token is drawn but is
not folded into the recorded log-prob, so the trainer's recomputed log-prob of the same token
(with the same τ) equals it at the first update.

Routing record (mixture-of-experts models, ``SamplerConfig.record_routing``): the prefill and
every decode step also return the experts each fed token was routed to, written on device into
a ``[L, B, S+T, k]`` int32 buffer (``-1`` where no token was fed: the last completion position,
and positions after an early stop) and returned as ``Rollout.routes`` (rows first). A trainer
replays them (routing replay, R3): ``model(tokens[:, :-1], routing=...)`` over the same tokens.
With a ``route_shift`` [L, D, E] (PR2's predicted router, methods/pr2/) every forward of the
rollout routes by ``TopK(g + x route_shift[l])`` and records those experts; the gates stay the
router's (``SamplerConfig.shift_gates``: the shifted ones).
"""

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx, struct

from posttrain_jax import parallel
from posttrain_jax.models import decode_cache
from posttrain_jax.rollout.types import Rollout


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
  """Static sampling settings (hashable: changing one recompiles).

  Attributes:
    max_new_tokens: T, the completion budget.
    temperature: τ; 0 means greedy.
    top_k: keep the k most likely tokens (0 = off).
    top_p: nucleus mass (1.0 = off).
    eos_id: end-of-sequence id.
    pad_id: id written after EOS.
    record_routing: mixture-of-experts models: record each position's experts into
      ``Rollout.routes`` (ignored by dense models, whose ``routes`` stay None).
    decode_chunk: decode in chunks of this many steps, each with a KV cache just long enough
      for the positions written by its end (prompt + steps so far); 0: one loop over the full
      ``S + T`` cache. A decode step reads its whole cache, so with one loop every step pays for
      all ``S + T`` positions; in chunks the average read is about halved for long
      completions. Same tokens and log-probs either way (tested).
    prefill_group: > 1 when every ``prefill_group`` consecutive rows share one prompt (a GRPO
      batch): the prefill runs once per prompt and its cache and last logits are repeated to
      the group's rows (the rows then decode independently). The caller guarantees the layout
      (``train.rl`` sets it only where its update's ``train/prefix_mismatch`` check covers the
      same rows). Same tokens and log-probs as 0 (tested); ignored when routing is recorded.
  """

  max_new_tokens: int
  eos_id: int
  pad_id: int
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  record_routing: bool = False
  decode_chunk: int = 64
  prefill_group: int = 0
  shift_gates: bool = False

  def __post_init__(self):
    if self.max_new_tokens < 1:
      raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
    if self.temperature < 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature}")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
    if self.decode_chunk < 0:
      raise ValueError(f"decode_chunk must be >= 0 (0: no chunks), got {self.decode_chunk}")


@struct.dataclass
class DecodeState:
  """Loop state of the decode ``while_loop``.

  Attributes:
    step: [] int32 index of the next completion token to write.
    last: [B] int32 token fed at this step.
    done: [B] bool, row has emitted EOS.
    completion: [B, T] int32 tokens written so far (pad elsewhere).
    logprobs: [B, T] float32 behaviour log-probs (0 where not written).
    cache: the KV cache.
    key: the sampling key (per-step keys are ``fold_in(key, step)``).
    routes: [L, B, S+T, k] int32 experts of each fed position (-1 elsewhere), or None when
      routing is not recorded.
  """

  step: jax.Array
  last: jax.Array
  done: jax.Array
  completion: jax.Array
  logprobs: jax.Array
  cache: decode_cache.KVCache
  key: jax.Array
  routes: jax.Array | None = None


def filter_logits(logits: jax.Array, *, top_k: int, top_p: float) -> jax.Array:
  """Sets logits outside the top-k / top-p set to -inf. ``[B, V] -> [B, V]``."""
  if top_k and top_k < logits.shape[-1]:
    kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if top_p < 1.0:
    sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each token
    keep_sorted = before < top_p
    threshold = jnp.min(jnp.where(keep_sorted, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < threshold, -jnp.inf, logits)
  return logits


def sample_token(key: jax.Array, logits: jax.Array, cfg: SamplerConfig):
  """Draws one token per row. ``logits`` [B, V] float32 -> (tokens [B] int32, logprobs [B])."""
  if cfg.temperature == 0.0:
    token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    scaled = logits
  else:
    scaled = logits / cfg.temperature
    filtered = filter_logits(scaled, top_k=cfg.top_k, top_p=cfg.top_p)
    token = jax.random.categorical(key, filtered, axis=-1).astype(jnp.int32)
  logp = jax.nn.log_softmax(scaled, axis=-1)
  return token, jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]


_ROUTE_NAMES = ("layers", "batch", "act_length", None)


def _record(routes: jax.Array | None, used: jax.Array | None, index) -> jax.Array | None:
  """``routes`` [L, B, S+T, k] with ``used`` [L, B, t, k] written from position ``index``."""
  if routes is None:
    return None
  routes = jax.lax.dynamic_update_slice(routes, used.astype(jnp.int32), (0, 0, index, 0))
  return parallel.constrain(routes, _ROUTE_NAMES)


def _generate(
  graphdef, params, prompts, prompt_mask, key, cfg: SamplerConfig, version=0, route_shift=None
) -> Rollout:
  model = nnx.merge(graphdef, params)
  route = {} if route_shift is None else dict(route_shift=route_shift, shift_gates=cfg.shift_gates)
  B, S = prompts.shape
  T = cfg.max_new_tokens
  chunk = cfg.decode_chunk or T
  ends = list(range(chunk, T, chunk)) + [T]  # each chunk decodes steps up to (not incl.) end
  start = (S - jnp.sum(prompt_mask, axis=1)).astype(jnp.int32)
  c = model.config
  record = cfg.record_routing and c.num_experts > 0
  routes = None
  if record:
    routes = jnp.full((c.num_layers, B, S + T, c.num_experts_per_tok), -1, jnp.int32)
  layers = model.layer_params()  # sliced once, outside the decode loops
  g = cfg.prefill_group
  if g > 1 and not record and route_shift is None:
    if B % g:
      raise ValueError(f"prefill_group={g} does not divide the {B} prompt rows")
    out = decode_cache.prefill_shared(model, prompts, start, g, S + ends[0], layers=layers)
  else:
    cache = decode_cache.constrain(decode_cache.init_cache(c, B, S + ends[0], start))
    out = decode_cache.prefill(model, prompts, cache, layers=layers, return_routing=record, **route)
  routes = _record(routes, out.routing, 0)
  token, logp = sample_token(jax.random.fold_in(key, 0), out.logits[:, -1], cfg)
  completion = jnp.full((B, T), cfg.pad_id, jnp.int32).at[:, 0].set(token)
  logprobs = jnp.zeros((B, T), jnp.float32).at[:, 0].set(logp)
  state = DecodeState(
    step=jnp.ones((), jnp.int32),
    last=token,
    done=token == cfg.eos_id,
    completion=completion,
    logprobs=logprobs,
    cache=out.cache,
    key=key,
    routes=routes,
  )

  def cond(s: DecodeState, end: int):
    return (s.step < end) & ~jnp.all(s.done)

  def body(s: DecodeState):
    index = s.cache.index  # the position s.last is written to (S + step - 1)
    out = decode_cache.decode_step(
      model, s.last, s.cache, layers=layers, return_routing=record, **route
    )
    token, logp = sample_token(jax.random.fold_in(s.key, s.step), out.logits[:, 0], cfg)
    token = jnp.where(s.done, cfg.pad_id, token)
    logp = jnp.where(s.done, 0.0, logp)
    completion = jax.lax.dynamic_update_slice(s.completion, token[:, None], (0, s.step))
    logprobs = jax.lax.dynamic_update_slice(s.logprobs, logp[:, None], (0, s.step))
    return DecodeState(
      step=s.step + 1,
      last=token,
      done=s.done | (token == cfg.eos_id),
      completion=completion,
      logprobs=logprobs,
      cache=out.cache,
      key=s.key,
      routes=_record(s.routes, out.routing, index),
    )

  for end in ends:
    # Step `end - 1` writes position S + end - 2: a cache of S + end positions holds it.
    state = state.replace(cache=decode_cache.grow(state.cache, S + end))
    state = jax.lax.while_loop(lambda s, end=end: cond(s, end), body, state)
  is_eos = state.completion == cfg.eos_id
  first_eos = jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1), T)
  positions = jnp.arange(T)[None, :]
  completion_mask = (positions <= first_eos[:, None]).astype(jnp.float32)
  completion_mask = completion_mask * (positions < T)
  completion = jnp.where(completion_mask > 0, state.completion, cfg.pad_id)
  return Rollout(
    tokens=jnp.concatenate([prompts, completion], axis=1),
    prompt_mask=prompt_mask.astype(jnp.float32),
    completion_mask=completion_mask,
    logprobs=state.logprobs * completion_mask,
    lengths=jnp.sum(completion_mask, axis=1).astype(jnp.int32),
    truncated=first_eos >= T,
    group=jnp.arange(B, dtype=jnp.int32),
    policy_version=jnp.full((B,), version, jnp.int32),
    routes=None if state.routes is None else jnp.swapaxes(state.routes, 0, 1),
  )


def make_sampler(
  graphdef, cfg: SamplerConfig, *, mesh: jax.sharding.Mesh | None = None, rules="sampler"
) -> Callable:
  """A jitted ``sample(params, prompts [B,S] int32, prompt_mask [B,S], key, version=0,
  route_shift=None) -> Rollout``; the Rollout's ``policy_version`` is ``version`` (the weights'
  version); ``route_shift`` [L, D, E] (mixture of experts) shifts the experts' selection.

  ``graphdef`` is the nnx graph of the model (``nnx.split(model)[0]``); ``params`` its state.
  One compilation per (B, S) shape; keep S bucketed (rollout.types.left_pad).

  With a ``mesh``, the parameters are placed with the sampler role's rules (tensor-parallel
  only; a no-op when they lie so already, e.g. a rollout.InferenceWeights copy), prompt rows
  over the batch axes, and the KV cache constrained likewise. Host prompts must then be the
  same in every process. The compiled sampler is stored and loaded from on a rerun when an
  entry point installed a store (parallel.executables.install).
  """

  def generate(params, prompts, mask, key, version, route_shift):
    with parallel.activation_sharding(mesh, rules):
      return _generate(graphdef, params, prompts, mask, key, cfg, version, route_shift)

  fn = parallel.executables.jit(generate, name="rollout.sampler", static=(cfg, mesh, rules))
  if mesh is None:
    return lambda params, prompts, mask, key, version=0, route_shift=None: fn(
      params, prompts, mask, key, version, route_shift
    )

  def sample(params, prompts, mask, key, version=0, route_shift=None):
    params = parallel.put(params, parallel.param_shardings(params, mesh, rules))
    rows = parallel.batch_sharding(mesh, prompts.shape[0], rules)
    prompts, mask = parallel.put((prompts, mask), rows)
    if route_shift is not None:
      route_shift = parallel.put(route_shift, parallel.replicated(mesh))
    return fn(
      params,
      prompts,
      mask,
      key,
      parallel.put(jnp.int32(version), parallel.replicated(mesh)),
      route_shift,
    )

  return sample
