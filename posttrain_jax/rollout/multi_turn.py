"""Multi-turn rollouts: the jitted decode loop with tokens the host inserts between the model's turns.

A row's completion is one contiguous token stream after its prompt: the model's own tokens
(sampled, with behaviour log-probs) and tokens the host inserted (a tool's observation after a
call, or a given prefix before the first turn: rollouts that continue from a prefix). Every
decode step writes one token per row at the same cache position, so the KV cache, the RoPE
positions and the trainer's forward over ``Rollout.tokens`` are those of a single-turn rollout;
only the masks differ: ``completion_mask`` is 1 on the model's own tokens (the loss and the
behaviour log-probs), ``env_mask`` on the inserted ones.

The loop (:func:`_resume`, one ``lax.while_loop``) stops early when a row ends a tool call
(its last sampled tokens equal ``TurnConfig.stop_ids``, e.g. ``</tool>``): the host reads that
row's turn, runs the tool and hands back its observation tokens, which the next call of the
same compiled loop writes (one per step, forced, log-prob 0) before the row samples again.
Rows that are mid-turn keep sampling; rows that are done write padding. So no row ever idles
inside a sequence, a call returns to the host only when some row needs it, and a run compiles
three programs per ``(B, S)`` shape (begin, resume, finish) whatever the turn counts.

Host protocol (:func:`make_multi_turn_sampler`): ``respond(rows, turns)`` gets the rows that
ended a call and each one's turn (its own token ids since its last insertion) and returns one
``(observation ids, end)`` per row: ``end`` stops that row after its observation (the turn cap,
the tool-failure cap). A row's episode also ends at EOS (its final answer) or at the token
budget ``T`` (``truncated``).

Limits: the KV cache has all ``S + T`` positions from the start (no decode chunks); routing is
not recorded (mixture-of-experts routing replay needs the single-turn sampler); an observation
longer than ``TurnConfig.max_insert`` tokens is cut by the caller (``respond``).
"""

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from posttrain_jax import parallel
from posttrain_jax.models import decode_cache
from posttrain_jax.rollout.sampler import SamplerConfig, sample_token
from posttrain_jax.rollout.types import Rollout


@dataclasses.dataclass(frozen=True)
class TurnConfig:
  """Static settings of the turns (hashable: changing one recompiles).

  Attributes:
    stop_ids: the token ids that end a tool-call turn (the encoded ``</tool>``); () for
      rollouts that only continue from a given prefix.
    max_insert: Q, the widest insertion (observation or prefix) in tokens.
  """

  stop_ids: tuple[int, ...]
  max_insert: int

  def __post_init__(self):
    if self.max_insert < 1:
      raise ValueError(f"max_insert must be >= 1, got {self.max_insert}")


@struct.dataclass
class EpisodeState:
  """Loop state of a multi-turn rollout (rows ``B``, budget ``T``, insert width ``Q``).

  Attributes:
    step: [] int32 index of the next completion token to write.
    last: [B] int32 token fed at this step (the one written at ``step - 1``).
    done: [B] bool, the row writes no more tokens of its own (EOS, or ended by the host).
    waiting: [B] bool, the row ended a tool call and waits for its observation.
    completion: [B, T] int32 tokens written so far (pad elsewhere).
    logprobs: [B, T] float32 behaviour log-probs of the model's tokens (0 elsewhere).
    own: [B, T] bool, the model sampled this token.
    inserted: [B, T] bool, the host inserted this token.
    insert: [B, Q] int32 tokens to insert, from ``insert_pos`` up to ``insert_len``.
    insert_len: [B] int32.
    insert_pos: [B] int32.
    tail: [B, m] int32 the row's last ``m = len(stop_ids)`` own tokens since its last
      insertion (-1 where fewer).
    cache: the KV cache (``S + T`` positions).
    key: the sampling key (per-step keys are ``fold_in(key, step)``, as the single-turn
      sampler's).
  """

  step: jax.Array
  last: jax.Array
  done: jax.Array
  waiting: jax.Array
  completion: jax.Array
  logprobs: jax.Array
  own: jax.Array
  inserted: jax.Array
  insert: jax.Array
  insert_len: jax.Array
  insert_pos: jax.Array
  tail: jax.Array
  cache: decode_cache.KVCache
  key: jax.Array


def _write(
  s: EpisodeState, logits: jax.Array, cfg: SamplerConfig, turns: TurnConfig
) -> EpisodeState:
  """Writes completion position ``s.step`` for every row: its next inserted token if one is
  pending, else (rows not done) a sampled one, else padding; ``logits`` [B, V] are the
  model's at the previous position."""
  pending = s.insert_pos < s.insert_len
  Q = s.insert.shape[1]
  forced = jnp.take_along_axis(s.insert, jnp.minimum(s.insert_pos, Q - 1)[:, None], axis=1)[:, 0]
  sampled, logp = sample_token(jax.random.fold_in(s.key, s.step), logits, cfg)
  own = ~pending & ~s.done
  token = jnp.where(pending, forced, jnp.where(own, sampled, cfg.pad_id))
  logp = jnp.where(own, logp, 0.0)
  m = s.tail.shape[1]
  waiting = jnp.zeros_like(own)
  tail = s.tail
  if m:
    shifted = jnp.concatenate([s.tail[:, 1:], token[:, None]], axis=1)
    tail = jnp.where(own[:, None], shifted, jnp.where(pending[:, None], -1, s.tail))
    waiting = own & jnp.all(tail == jnp.asarray(turns.stop_ids, jnp.int32)[None, :], axis=1)
  at = (0, s.step)
  put = lambda buf, x: jax.lax.dynamic_update_slice(buf, x[:, None].astype(buf.dtype), at)
  return s.replace(
    step=s.step + 1,
    last=token,
    done=s.done | (own & (token == cfg.eos_id)),
    waiting=waiting,
    completion=put(s.completion, token),
    logprobs=put(s.logprobs, logp),
    own=put(s.own, own),
    inserted=put(s.inserted, pending),
    insert_pos=s.insert_pos + pending.astype(jnp.int32),
    tail=tail,
  )


def _begin(
  graphdef,
  params,
  prompts,
  prompt_mask,
  key,
  insert,
  insert_len,
  tail,
  cfg: SamplerConfig,
  turns: TurnConfig,
) -> EpisodeState:
  """Prefill, then position 0 (a prefix's first token, or the model's first). ``tail`` [B, m]:
  each row's last own tokens of a turn begun before this rollout (-1 where none)."""
  model = nnx.merge(graphdef, params)
  B, S = prompts.shape
  T = cfg.max_new_tokens
  start = (S - jnp.sum(prompt_mask, axis=1)).astype(jnp.int32)
  cache = decode_cache.constrain(decode_cache.init_cache(model.config, B, S + T, start))
  out = decode_cache.prefill(model, prompts, cache, layers=model.layer_params())
  flags = jnp.zeros((B, T), bool)
  state = EpisodeState(
    step=jnp.zeros((), jnp.int32),
    last=jnp.full((B,), cfg.pad_id, jnp.int32),
    done=jnp.zeros((B,), bool),
    waiting=jnp.zeros((B,), bool),
    completion=jnp.full((B, T), cfg.pad_id, jnp.int32),
    logprobs=jnp.zeros((B, T), jnp.float32),
    own=flags,
    inserted=flags,
    insert=insert.astype(jnp.int32),
    insert_len=insert_len.astype(jnp.int32),
    insert_pos=jnp.zeros((B,), jnp.int32),
    tail=tail.astype(jnp.int32),
    cache=out.cache,
    key=key,
  )
  return _write(state, out.logits[:, -1], cfg, turns)


def _idle(s: EpisodeState) -> jax.Array:
  """[B] rows with nothing left to write (done, no insertion pending)."""
  return s.done & (s.insert_pos >= s.insert_len)


def _resume(
  graphdef,
  params,
  state: EpisodeState,
  rows,
  insert,
  insert_len,
  end,
  admit,
  refill,
  cfg: SamplerConfig,
  turns: TurnConfig,
) -> EpisodeState:
  """Hands ``rows`` [B] bool their insertions (``insert`` [B, Q], ``insert_len`` [B]; ``end``
  [B]: the row stops after it) and ``admit`` [B] bool rows a new episode whose prompt is their
  ``insert`` (continuous batching: the row's old tokens are masked from then on and its RoPE
  positions start again at 0), then decodes until every row is done (none with tokens left
  to insert), some row waits for an observation, the budget is spent or, with ``refill``,
  one more row has nothing left to write (its slot can take the next episode)."""
  model = nnx.merge(graphdef, params)
  T = cfg.max_new_tokens
  layers = model.layer_params()
  given = rows | admit
  pick = lambda new, old: jnp.where(given.reshape(given.shape + (1,) * (old.ndim - 1)), new, old)
  insert = insert.astype(jnp.int32)
  # An admitted prompt's first token is fed at the cache's next position (the row's new start);
  # the rest is written like any insertion.
  state = state.replace(
    insert=pick(insert, state.insert),
    insert_len=pick(insert_len.astype(jnp.int32), state.insert_len),
    insert_pos=jnp.where(admit, 1, pick(jnp.zeros_like(state.insert_pos), state.insert_pos)),
    last=jnp.where(admit, insert[:, 0], state.last),
    tail=jnp.where(admit[:, None], -1, state.tail),
    waiting=state.waiting & ~given,
    done=(state.done | (rows & end)) & ~admit,
    cache=state.cache.replace(start=jnp.where(admit, state.cache.index, state.cache.start)),
  )
  idle_at_entry = jnp.sum(_idle(state))

  def cond(s: EpisodeState):
    busy = ~s.done | (s.insert_pos < s.insert_len)
    freed = refill & (jnp.sum(_idle(s)) > idle_at_entry)
    return (s.step < T) & jnp.any(busy) & ~jnp.any(s.waiting) & ~freed

  def body(s: EpisodeState):
    out = decode_cache.decode_step(model, s.last, s.cache, layers=layers)
    return _write(s.replace(cache=out.cache), out.logits[:, 0], cfg, turns)

  return jax.lax.while_loop(cond, body, state)


def _finish(state: EpisodeState, prompts, prompt_mask, version, group) -> Rollout:
  own = state.own.astype(jnp.float32)
  return Rollout(
    tokens=jnp.concatenate([prompts, state.completion], axis=1),
    prompt_mask=prompt_mask.astype(jnp.float32),
    completion_mask=own,
    logprobs=state.logprobs * own,
    lengths=jnp.sum(own, axis=1).astype(jnp.int32),
    truncated=~state.done,
    group=group,
    policy_version=jnp.full((own.shape[0],), version, jnp.int32),
    env_mask=state.inserted.astype(jnp.float32),
  )


# What a row ended a call with, and what the host answers: the row's turn (its own token ids
# since its last insertion) -> (observation ids, whether the row stops after them).
Respond = Callable[[np.ndarray, Sequence[np.ndarray]], Sequence[tuple[Sequence[int], bool]]]


# Continuous batching: the rows that have nothing left to write and the step -> for each row
# the prompt ids of the episode it starts next (its first token is fed at once, the rest are
# written from ``step`` on, in ``env_mask``), or None when no episode is left.
Admit = Callable[[np.ndarray, int], Sequence[Sequence[int] | None]]


def make_multi_turn_sampler(
  graphdef,
  cfg: SamplerConfig,
  turns: TurnConfig,
  *,
  mesh: jax.sharding.Mesh | None = None,
  rules="sampler",
) -> Callable:
  """``sample(params, prompts [B,S], prompt_mask [B,S], key, version=0, *, respond=None,
  prefix=None) -> Rollout``: a multi-turn rollout (module docstring).

  ``respond(rows, turns)``: see :data:`Respond` (None: a tool call ends nothing, the row
  goes on sampling, as in a single-turn rollout that keeps its ``env_mask`` at 0).
  ``prefix``: ``(ids [B, Q] int32, lengths [B])`` inserted before each row's first own token
  (ids past a row's length are ignored); None: no prefix. ``tail``: ``[B, len(stop_ids)]`` the
  last own tokens of a turn each row began before this call (-1 where none; a call's end that
  straddles two calls is then still found; rollout/buckets.py). The Rollout's ``completion_mask``
  is the model's tokens, ``env_mask`` the inserted ones, ``truncated`` the rows that ran out
  of the budget ``T`` before EOS or an ``end``. ``admit``: see :data:`Admit` (continuous
  batching; rollout/buckets.py reads the episodes out of the rows, whose Rollout fields then
  describe the rows, not episodes). With the same key and no insertions, the tokens
  and log-probs equal :func:`~posttrain_jax.rollout.make_sampler`'s with ``decode_chunk=0``
  and no shared prefill (tested).
  """
  if cfg.prefill_group > 1 or cfg.record_routing:
    raise ValueError("multi-turn rollouts take no prefill_group or record_routing")
  Q = turns.max_insert

  def with_mesh(fn):
    def wrapped(*args):
      with parallel.activation_sharding(mesh, rules):
        return fn(*args)

    return wrapped

  static = (cfg, turns, mesh, rules)
  begin = parallel.executables.jit(
    with_mesh(lambda p, x, m, k, i, n, t: _begin(graphdef, p, x, m, k, i, n, t, cfg, turns)),
    name="rollout.multi_turn.begin",
    static=static,
  )
  resume = parallel.executables.jit(
    with_mesh(lambda p, s, r, i, n, e, a, f: _resume(graphdef, p, s, r, i, n, e, a, f, cfg, turns)),
    name="rollout.multi_turn.resume",
    static=static,
    donate_argnums=(1,),
  )
  finish = parallel.executables.jit(_finish, name="rollout.multi_turn.finish", static=static)

  def put_rows(x, B):
    return x if mesh is None else parallel.put(x, parallel.batch_sharding(mesh, B, rules))

  def sample(
    params,
    prompts,
    prompt_mask,
    key,
    version=0,
    *,
    respond: Respond | None = None,
    prefix=None,
    tail=None,
    admit: Admit | None = None,
  ):
    B = prompts.shape[0]
    T = cfg.max_new_tokens
    if mesh is not None:
      params = parallel.put(params, parallel.param_shardings(params, mesh, rules))
    ids, lengths = _insertions(B, Q, prefix)
    prompts, prompt_mask = put_rows((prompts, prompt_mask), B)
    m = len(turns.stop_ids)
    tail = np.full((B, m), -1, np.int32) if tail is None else np.asarray(tail, np.int32)
    if tail.shape != (B, m):
      raise ValueError(f"tail must be [B, len(stop_ids)] = [{B}, {m}], got {tail.shape}")
    state = begin(params, prompts, prompt_mask, key, *put_rows((ids, lengths, tail), B))
    # A row's current turn starts after its last insertion (the prefix, then each observation).
    turn_start = np.asarray(lengths, np.int64).copy()
    rows, end, admitted = np.zeros(B, bool), np.zeros(B, bool), np.zeros(B, bool)
    refill = admit is not None
    while True:
      state = resume(
        params, state, *put_rows((rows, ids, lengths, end, admitted), B), np.bool_(refill)
      )
      step, waiting, idle = (
        int(x) if np.ndim(x) == 0 else np.asarray(x)
        for x in parallel.to_host((state.step, state.waiting, _idle(state)))
      )
      if step >= T:
        break
      rows, free = waiting.copy(), np.flatnonzero(idle) if refill else np.zeros(0, int)
      if not rows.any() and not len(free):
        break
      ids, lengths = np.zeros((B, Q), np.int32), np.zeros(B, np.int32)
      end, admitted = np.zeros(B, bool), np.zeros(B, bool)
      if rows.any():
        completion, own = parallel.to_host((state.completion, state.own))
        index = np.flatnonzero(rows)
        turns_ids = [
          completion[r, turn_start[r] : step][own[r, turn_start[r] : step]] for r in index
        ]
        replies = [(None, False)] * len(index) if respond is None else respond(index, turns_ids)
        if len(replies) != len(index):
          raise ValueError(f"respond answered {len(replies)} rows, expected {len(index)}")
        for r, (obs, stop) in zip(index, replies):
          obs = [] if obs is None else list(obs)
          if len(obs) > Q:
            raise ValueError(
              f"an observation of {len(obs)} tokens does not fit "
              f"TurnConfig.max_insert={Q}: cut it in respond"
            )
          ids[r, : len(obs)], lengths[r], end[r] = obs, len(obs), bool(stop)
          turn_start[r] = step + len(obs)
      if len(free):
        for r, new in zip(free, admit(free, step)):
          if new is None:  # nothing left to admit: free rows stay idle from now on
            refill = False
            continue
          new = list(new)
          if not 1 <= len(new) <= Q:
            raise ValueError(
              f"an admitted prompt of {len(new)} tokens does not fit TurnConfig.max_insert={Q}"
            )
          ids[r, : len(new)], lengths[r], admitted[r] = new, len(new), True
          turn_start[r] = step + len(new) - 1
    group = jnp.arange(B, dtype=jnp.int32)
    return finish(state, prompts, prompt_mask, jnp.int32(version), put_rows(group, B))

  return sample


def _insertions(B: int, Q: int, prefix):
  """``(ids [B, Q] int32, lengths [B] int32)`` of the prefix (zeros without one)."""
  if prefix is None:
    return np.zeros((B, Q), np.int32), np.zeros(B, np.int32)
  ids, lengths = (np.asarray(x) for x in prefix)
  if ids.ndim != 2 or ids.shape[0] != B or lengths.shape != (B,):
    raise ValueError(
      f"prefix must be (ids [B, Q], lengths [B]) for B={B}, got shapes "
      f"{ids.shape} and {lengths.shape}"
    )
  if ids.shape[1] > Q or (lengths > ids.shape[1]).any() or (lengths < 0).any():
    raise ValueError(
      f"prefix lengths must lie in [0, {min(Q, ids.shape[1])}] (TurnConfig."
      f"max_insert={Q}), got up to {lengths.max()} over ids of width "
      f"{ids.shape[1]}"
    )
  out = np.zeros((B, Q), np.int32)
  out[:, : ids.shape[1]] = ids
  return out, lengths.astype(np.int32)
