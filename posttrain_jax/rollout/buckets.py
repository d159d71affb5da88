"""Bucketed multi-turn rollouts: Libra's C-MLFQ scheduler over this library's own sampler.

Libra (methods_A.md section 11; the rules are derived there) cuts the makespan of long-tailed
agentic rollouts with a multi-level feedback queue: every episode starts in bucket 1 and is
demoted to the next bucket after a number of tool returns (a continuation signal: the episode
is not over) or after a token quantum, with no length prediction. Here a bucket is a batch
shape of the jitted multi-turn loop (rollout/multi_turn.py): ``Bucket(width, quantum, calls)``
runs up to ``width`` episodes for at most ``quantum`` new tokens and demotes an episode after
its ``calls``-th tool return in the bucket (0: never on calls).

Why it is faster than FIFO batching: a FIFO batch of ``B`` long-tailed episodes decodes until
its longest one ends, its finished rows writing padding; the buckets cap how long a wide batch
runs and pack the few long episodes together in the later buckets.

How an episode moves (:class:`BucketScheduler`): a demoted episode leaves its batch (the
sampler's ``end``: it writes its observation, then padding) and joins the next bucket's queue
with its transcript so far; when it runs again, its prompt is the original prompt followed by
that transcript, prefilled in one pass (recompute preemption: no KV cache is kept across
batches). RoPE positions count from a row's first real token, so the continuation sees what an
uninterrupted rollout sees: its behaviour log-probs equal a recomputed forward over the whole
transcript (tested). An insertion cut by a quantum's end (an observation, a prefix) is finished
at the start of the episode's next batch, as its prefix; a turn cut mid-way continues and is
handed to ``respond`` whole. The scheduler always runs the first bucket that has a full batch
queued, else the first non-empty one (a partial batch, rows rounded up to a power of two, and
to the mesh's device count; the filler rows stop at their first call and their output is
dropped). One bucket ``(B, T, 0)`` is FIFO batching: it equals the multi-turn sampler on each
batch of ``B`` episodes in turn (tested).

Continuous batching (``Bucket.refill``): a row whose episode ends or is demoted takes the next
fresh episode of its bucket's queue inside the running batch (multi_turn's ``admit``: the new
prompt is fed from the cache's next position, which becomes the row's start), so a batch does
not wait for its longest episode with idle rows; an episode still running at the quantum's end
is continued like any other. The scheduler reads each episode's segment out of its row.
"""

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from posttrain_jax import parallel
from posttrain_jax.rollout.multi_turn import Respond, TurnConfig, make_multi_turn_sampler
from posttrain_jax.rollout.sampler import SamplerConfig
from posttrain_jax.rollout.types import Rollout, bucket_length, left_pad


@dataclasses.dataclass(frozen=True)
class Bucket:
  """One level of the feedback queue.

  Attributes:
    width: the most episodes a batch of this bucket runs at once (its rows).
    quantum: the new tokens one batch of this bucket decodes (its sampler's budget).
    calls: tool returns after which an episode is demoted (0: never on calls).
    refill: continuous batching: a row whose episode ends (or is demoted) takes the next fresh
      episode of the queue within the batch (its prompt fed into the row's KV cache, its
      positions counted from there), instead of idling until the batch ends.
  """

  width: int
  quantum: int
  calls: int = 0
  refill: bool = False

  def __post_init__(self):
    for name in ("width", "quantum"):
      if int(getattr(self, name)) < 1:
        raise ValueError(f"Bucket.{name} must be >= 1, got {getattr(self, name)}")
    if int(self.calls) < 0:
      raise ValueError(f"Bucket.calls must be >= 0 (0: no demotion on calls), got {self.calls}")


def fifo(width: int, budget: int, refill: bool = False) -> tuple[Bucket]:
  """FIFO batching as one bucket: batches of ``width`` episodes, each run to its end, or with
  ``refill`` continuous batching (a freed row takes the next episode)."""
  return (Bucket(width, budget, 0, refill),)


@dataclasses.dataclass
class _Episode:
  """An episode's transcript so far (the completion tokens after its prompt) and its place."""

  prompt: list
  tokens: list = dataclasses.field(default_factory=list)
  own: list = dataclasses.field(default_factory=list)
  logprobs: list = dataclasses.field(default_factory=list)
  pending: list = dataclasses.field(default_factory=list)  # insertion left to write
  turn: list = dataclasses.field(default_factory=list)  # own tokens since the last insertion
  bucket: int = 0
  buckets: list = dataclasses.field(default_factory=list)  # the bucket of every batch it ran in
  starts: list = dataclasses.field(default_factory=list)  # its length when each one began
  calls: int = 0  # tool returns in its current bucket
  finished: bool = False
  truncated: bool = False

  def append(self, tokens, own, logprobs):
    self.tokens += list(map(int, tokens))
    self.own += list(map(bool, own))
    self.logprobs += list(map(float, logprobs))


@dataclasses.dataclass
class Stats:
  """What one scheduled rollout cost: batches run, rows decoded (filler rows included) and
  real, decode steps (the steps each batch ran, summed), row-steps (steps x rows) and the
  wall time in seconds."""

  batches: int = 0
  rows: int = 0
  real_rows: int = 0
  decode_steps: int = 0
  row_steps: int = 0
  seconds: float = 0.0
  per_bucket: dict = dataclasses.field(default_factory=dict)


class BucketScheduler:
  """``scheduler(params, prompts [N, S], prompt_mask [N, S], key, version=0, *, respond=None,
  prefix=None) -> Rollout``: the same contract as the multi-turn sampler's (its ``respond``
  gets episode indices in ``[0, N)`` and each one's whole turn), over ``N`` episodes of any
  number, scheduled in ``buckets`` (module docstring). The Rollout has the input's ``S`` and
  ``T = cfg.max_new_tokens``, the episodes' whole budget. ``last_stats`` is the last call's
  :class:`Stats`; ``history[i]`` lists the buckets episode ``i`` ran in, ``starts[i]`` its
  completion length when each of those batches began."""

  def __init__(
    self,
    graphdef,
    cfg: SamplerConfig,
    turns: TurnConfig,
    buckets,
    *,
    mesh=None,
    rules="sampler",
    min_rows: int | None = None,
  ):
    """``min_rows``: the fewest rows a batch has (filler rows make it up; default 1, or the
    mesh's device count, which the rows must divide)."""
    self.buckets = tuple(buckets)
    if not self.buckets:
      raise ValueError("BucketScheduler needs at least one Bucket")
    self.cfg, self.turns, self.mesh, self.rules = cfg, turns, mesh, rules
    self.min_rows = int(min_rows or (1 if mesh is None else mesh.devices.size))
    self.graphdef, self._samplers = graphdef, {}
    self.last_stats, self.history, self.starts = Stats(), [], []

  def _sampler(self, quantum: int, Q: int):
    """The multi-turn sampler of a batch of ``quantum`` tokens and insertions of up to ``Q``."""
    if (quantum, Q) not in self._samplers:
      self._samplers[quantum, Q] = make_multi_turn_sampler(
        self.graphdef,
        dataclasses.replace(self.cfg, max_new_tokens=quantum),
        dataclasses.replace(self.turns, max_insert=Q),
        mesh=self.mesh,
        rules=self.rules,
      )
    return self._samplers[quantum, Q]

  def __call__(
    self,
    params,
    prompts,
    prompt_mask,
    key,
    version=0,
    *,
    respond: Respond | None = None,
    prefix=None,
  ):
    t0 = time.perf_counter()
    prompts, prompt_mask = np.asarray(prompts), np.asarray(prompt_mask) > 0
    N, S = prompts.shape
    episodes = [_Episode(prompt=list(map(int, prompts[i][prompt_mask[i]]))) for i in range(N)]
    if prefix is not None:
      ids, lengths = (np.asarray(x) for x in prefix)
      for e, row, n in zip(episodes, ids, lengths):
        e.pending = list(map(int, row[: int(n)]))
    queues = [list(range(N))] + [[] for _ in self.buckets[1:]]
    stats = Stats()
    batch = 0
    while any(queues):
      level = next(
        (b for b, q in enumerate(queues) if len(q) >= self.buckets[b].width),
        next(b for b, q in enumerate(queues) if q),
      )
      ran = self._run(
        params, episodes, queues[level], level, S, jax.random.fold_in(key, batch), respond, stats
      )
      batch += 1
      for i in ran:
        e = episodes[i]
        if not e.finished:
          e.bucket = min(level + 1, len(self.buckets) - 1)
          e.calls = 0
          queues[e.bucket].append(i)
    self.history, self.starts = [e.buckets for e in episodes], [e.starts for e in episodes]
    stats.seconds = time.perf_counter() - t0
    self.last_stats = stats
    return self._assemble(prompts, prompt_mask, episodes, version)

  def _run(self, params, episodes, queue, level, S, key, respond, stats) -> list:
    """One batch of bucket ``level``: up to its width of the episodes at the head of ``queue``
    continue from their transcripts for at most the bucket's quantum; with ``refill``, a row
    that frees up takes the next fresh episode of ``queue``. Returns the episodes that ran."""
    spec, cfg, T = self.buckets[level], self.cfg, self.cfg.max_new_tokens
    stop = self.turns.stop_ids
    members = queue[: spec.width]
    del queue[: spec.width]
    n = len(members)
    rows = max(min(spec.width, bucket_length(n, 1)), self.min_rows)
    Q = self.turns.max_insert
    fresh = lambda i: not episodes[i].tokens and not episodes[i].pending
    if spec.refill:
      longest = max((len(episodes[i].prompt) for i in queue if fresh(i)), default=1)
      Q = max(Q, bucket_length(longest))
    contexts = [episodes[i].prompt + episodes[i].tokens for i in members]
    contexts += [contexts[0]] * (rows - n)
    tokens, mask = left_pad(
      contexts, cfg.pad_id, length=max(S, bucket_length(max(map(len, contexts))))
    )
    ids, lengths = np.zeros((rows, Q), np.int32), np.zeros(rows, np.int32)
    tail = np.full((rows, len(stop)), -1, np.int32)
    # Per episode: its row, where its segment of the row begins and how many of its first
    # inserted tokens are its prompt (an admitted episode's); the insertions handed to it (to
    # find one a quantum cut), the own tokens its answered calls consumed (the rest is its open
    # turn), and whether the host ended it.
    slot = dict(enumerate(members))
    seg, given, consumed, opening, ended = {}, {}, {}, {}, set()

    def enter(i, r, step, skip):
      e = episodes[i]
      e.buckets.append(level)
      e.starts.append(len(e.tokens))
      seg[i], slot[r] = (r, step, skip), i
      given[i] = [list(e.pending)] if e.pending else []
      consumed[i], opening[i] = 0, [] if e.pending else list(e.turn)

    for r, i in enumerate(members):
      e = episodes[i]
      if len(e.pending) > Q:
        raise ValueError(
          f"an insertion of {len(e.pending)} tokens does not fit TurnConfig.max_insert={Q}"
        )
      ids[r, : len(e.pending)], lengths[r] = e.pending, len(e.pending)
      if stop and not e.pending and e.turn:
        last = e.turn[-len(stop) :]
        tail[r, len(stop) - len(last) :] = last
      enter(i, r, 0, 0)

    def answer(rows_, turns_):
      out, real = {}, []
      for r, t in zip(map(int, rows_), turns_):
        i = slot.get(r)
        if i is None:
          out[r] = ([], True)  # filler rows stop at their first call
          continue
        consumed[i] += len(t)
        # A call that ends at or past the whole budget T is not answered (the multi-turn
        # loop answers none on its last position): the row stops and is cut at T.
        if len(episodes[i].tokens) + consumed[i] + sum(map(len, given[i])) >= T:
          out[r] = ([], True)
        else:
          real.append((r, i, list(map(int, t))))
      replies = self._ask(
        respond, [i for _, i, _ in real], [opening.pop(i, []) + t for _, i, t in real]
      )
      for (r, i, _), (obs, end) in zip(real, replies):
        opening[i] = []
        given[i].append(obs)
        end = self._answered(episodes[i], spec, end)
        if end == "end":
          ended.add(i)
        out[r] = (obs, end is not None)
      return [out[int(r)] for r in rows_]

    def admit(rows_, step):
      out = []
      for r in map(int, rows_):
        i = next((j for j in queue if fresh(j)), None)
        if i is None:
          slot.pop(r, None)
          out.append(None)
          continue
        queue.remove(i)
        members.append(i)
        enter(i, r, step, len(episodes[i].prompt) - 1)
        out.append(episodes[i].prompt)
      return out

    ro = self._sampler(spec.quantum, Q)(
      params,
      tokens,
      mask,
      key,
      respond=answer if stop else None,
      prefix=(ids, lengths),
      tail=tail,
      admit=admit if spec.refill else None,
    )
    comp, own, env, logp = (
      np.asarray(x)
      for x in jax.device_get((ro.completion, ro.completion_mask, ro.env_mask, ro.logprobs))
    )
    written = (own > 0) | (env > 0)
    steps = int(np.flatnonzero(written.any(axis=0))[-1]) + 1 if written.any() else 0
    stats.batches += 1
    stats.rows += rows
    stats.real_rows += len(members)
    stats.decode_steps += steps
    stats.row_steps += steps * rows
    stats.per_bucket[level] = stats.per_bucket.get(level, 0) + 1
    starts = {}
    for i, (r, s0, _) in seg.items():
      starts.setdefault(r, []).append(s0)
    for i in members:
      r, s0, skip = seg[i]
      s1 = min([s for s in starts[r] if s > s0], default=comp.shape[1])
      keep = np.flatnonzero(written[r, s0:s1])[skip:] + s0
      self._close(
        episodes[i],
        i,
        comp[r, keep],
        own[r, keep] > 0,
        logp[r, keep],
        given[i],
        consumed[i],
        opening.get(i, []),
        i in ended,
        respond,
        spec,
        T,
      )
    return members

  def _close(
    self, e: _Episode, i, comp, mine, logp, given, consumed, opening, ended, respond, spec, T
  ):
    """Appends what episode ``e`` (index ``i``) wrote in a batch (``comp``, ``mine`` its own
    tokens, ``logp``) and settles its state: its open turn, an insertion the quantum cut, a
    call the quantum's last token ended, and whether it finished."""
    stop, eos_id = self.turns.stop_ids, self.cfg.eos_id
    e.append(comp, mine, logp)
    e.turn = opening + [int(t) for t in comp[mine]][consumed:]
    # Only the last insertion can be cut (by the quantum's end): its rest is still to write.
    left = sum(map(len, given)) - int((~mine).sum())
    e.pending = given[-1][len(given[-1]) - left :] if left > 0 else []
    eos = bool(len(comp) and mine[-1] and comp[-1] == eos_id)
    if (
      stop
      and not eos
      and not ended
      and not e.pending
      and len(e.tokens) < T
      and len(e.turn) >= len(stop)
      and tuple(e.turn[-len(stop) :]) == tuple(stop)
    ):
      # The call ended on the quantum's last token, which the loop does not answer.
      ((obs, end),) = self._ask(respond, [i], [e.turn])
      e.turn, e.pending = [], list(obs)
      ended = self._answered(e, spec, end) == "end"
    if eos or ended:
      # It writes the rest of its last observation and stops: forced tokens, no model step.
      e.append(e.pending, [False] * len(e.pending), [0.0] * len(e.pending))
      e.pending, e.finished = [], True
    self._cap(e, T)

  @staticmethod
  def _ask(respond, episodes, turns):
    """``respond``'s ``(observation ids, end)`` per episode (``([], False)`` without one)."""
    if not episodes:
      return []
    if respond is None:
      return [([], False)] * len(episodes)
    replies = respond(np.asarray(episodes), [np.asarray(t, np.int64) for t in turns])
    if len(replies) != len(episodes):
      raise ValueError(f"respond answered {len(replies)} episodes, expected {len(episodes)}")
    return [([] if obs is None else list(map(int, obs)), bool(end)) for obs, end in replies]

  @staticmethod
  def _answered(e: _Episode, spec: Bucket, end: bool):
    """Counts a tool return of ``e``: "end" (the host ended it), "demote" (its bucket's
    ``calls`` are spent) or None (it goes on in this batch)."""
    e.calls += 1
    if end:
      return "end"
    return "demote" if spec.calls and e.calls >= spec.calls else None

  @staticmethod
  def _cap(e: _Episode, T: int):
    """Ends ``e`` at the whole budget ``T``: truncated unless its last own token (the EOS, or
    the call the host ended it on) lies within ``T``."""
    if len(e.tokens) < T:
      return
    own = np.flatnonzero(e.own)
    e.truncated = not e.finished or (own.size > 0 and own[-1] >= T)
    del e.tokens[T:], e.own[T:], e.logprobs[T:]
    e.finished, e.pending = True, []

  def _assemble(self, prompts, prompt_mask, episodes, version) -> Rollout:
    N, T, pad = len(episodes), self.cfg.max_new_tokens, self.cfg.pad_id
    comp = np.full((N, T), pad, np.int32)
    own, env, logp = (
      np.zeros((N, T), np.float32),
      np.zeros((N, T), np.float32),
      np.zeros((N, T), np.float32),
    )
    for i, e in enumerate(episodes):
      n = len(e.tokens)
      comp[i, :n] = e.tokens
      own[i, :n] = e.own
      env[i, :n] = ~np.asarray(e.own, bool)
      logp[i, :n] = e.logprobs
    ro = Rollout(
      tokens=np.concatenate([prompts.astype(np.int32), comp], axis=1),
      prompt_mask=prompt_mask.astype(np.float32),
      completion_mask=own,
      logprobs=logp * own,
      lengths=own.sum(axis=1).astype(np.int32),
      truncated=np.asarray([e.truncated for e in episodes]),
      group=np.arange(N, dtype=np.int32),
      policy_version=np.full((N,), version, np.int32),
      env_mask=env,
    )
    if self.mesh is None:
      return jax.tree.map(jnp.asarray, ro)
    return parallel.put(ro, parallel.batch_sharding(self.mesh, N, self.rules))
