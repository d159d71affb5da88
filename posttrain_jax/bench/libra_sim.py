"""Libra (methods_A.md section 11, arXiv 2606.03077): a discrete-event simulator of agentic RL
rollouts on a GPU pool, with the C-MLFQ bucket scheduler and the adaptive rollout/train split.

Everything below is *derived* (the paper's mechanism names, rules written here); each rule is
one function or field, to change in one place.

Workload (:class:`Workload`): each RL step needs ``rows`` trajectories. A trajectory has
``1 + floor(LogNormal(0, turns_sigma))`` turns (at most ``max_turns``: long-tailed); each turn
decodes ``LogNormal`` tokens whose mean grows linearly by ``drift`` over the run (the drifting
workload), and every turn but the last ends in a tool call of ``LogNormal`` latency.

Rollout engines (:class:`Cluster`): the rollout GPUs are grouped into engines of a tensor-
parallel degree ``tp``; an engine holds ``slots * tp`` rows and one decode step, which gives
every row it holds one token, takes ``(step_a + step_c * k) / tp ** tp_beta`` seconds for ``k``
rows (:func:`step_time`). A row in a tool call holds no slot.

Scheduling (:class:`Policy`): ``L`` buckets, bucket ``b`` served by engines of degree
``tp[b]`` on a share ``gpu_share[b]`` of the rollout GPUs. A request starts in bucket 0 and is
demoted one bucket (C-MLFQ) after each tool return and whenever it has decoded ``quantum[b]``
tokens in its bucket (it then yields its slot). Free slots take requests from their own
bucket's queue first, then from the buckets before it (newer requests), never from a later one,
first come first served.
``L = 1`` (one bucket of degree-1 engines) is FIFO continuous batching.

Training and the split (:func:`run`): training a step takes ``tokens * train_s_per_token /
W_t`` seconds; step ``k``'s rollouts start once step ``k - 1``'s rollouts are done and step
``k - 2``'s update is (one step off-policy), step ``k``'s update once its rollouts and the
previous update are done. Static split: ``W_r`` fixed. Adaptive (the global planner): every
``plan_every`` steps, ``W_r`` minimises ``max(T_roll(W_r), T_train(W - W_r))`` with
``T = x / W + y`` fitted by least squares to the last ``window`` steps' times (:func:`fit_time`:
``y`` is the part more workers do not shorten, a rollout's critical path), effective from the
next step, moving at most ``max_move`` GPUs at a time (an elastic pool) and keeping one engine
per bucket; after ``window`` steps at one split it moves one GPU to probe another.
"""

import dataclasses
import heapq
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class Workload:
  rows: int = 64
  steps: int = 12
  turns_sigma: float = 1.0
  max_turns: int = 24
  tokens_mean: float = 150.0
  tokens_sigma: float = 0.5
  drift: float = 1.0
  tool_mean_s: float = 1.0
  tool_sigma: float = 0.5


@dataclasses.dataclass(frozen=True)
class Cluster:
  gpus: int = 16
  slots: int = 16
  step_a: float = 0.02
  step_c: float = 0.001
  tp_beta: float = 0.7
  train_s_per_token: float = 0.015


@dataclasses.dataclass(frozen=True)
class Policy:
  """``tp``, ``gpu_share``, ``quantum``: one entry per bucket (``L = len(tp)``)."""

  tp: tuple = (1,)
  gpu_share: tuple = (1.0,)
  quantum: tuple = (math.inf,)
  adaptive: bool = False
  rollout_gpus: int = 8
  plan_every: int = 1
  window: int = 4
  max_move: int = 2

  def __post_init__(self):
    if not len(self.tp) == len(self.gpu_share) == len(self.quantum) >= 1:
      raise ValueError("Policy tp, gpu_share and quantum need one entry per bucket")
    if abs(sum(self.gpu_share) - 1.0) > 1e-9:
      raise ValueError(f"Policy gpu_share must sum to 1, got {self.gpu_share}")


FIFO = Policy()


def step_time(cluster: Cluster, tp: int, rows: int) -> float:
  """Seconds of one decode step of an engine of degree ``tp`` holding ``rows`` rows."""
  return (cluster.step_a + cluster.step_c * rows) / tp**cluster.tp_beta


def trajectories(rng: np.random.Generator, w: Workload, step: int) -> list[dict]:
  """The step's requests: per request, its turns' token counts and tool latencies."""
  mean = w.tokens_mean * (1.0 + w.drift * step / max(w.steps - 1, 1))
  mu = math.log(mean) - w.tokens_sigma**2 / 2
  out = []
  for i in range(w.rows):
    turns = min(1 + int(rng.lognormal(0.0, w.turns_sigma)), w.max_turns)
    tokens = np.maximum(1, rng.lognormal(mu, w.tokens_sigma, turns).astype(int))
    tools = rng.lognormal(math.log(w.tool_mean_s), w.tool_sigma, turns - 1)
    out.append({"id": i, "tokens": [int(t) for t in tokens], "tools": [float(t) for t in tools]})
  return out


def engines(policy: Policy, gpus: int) -> list[tuple[int, int]]:
  """``(bucket, tp)`` of each engine: bucket ``b`` gets about ``gpu_share[b] * gpus`` GPUs in
  engines of degree ``tp[b]``, at least one engine; the last bucket takes what is left (GPUs
  that fill no engine of its degree idle). ValueError when the GPUs cannot give every bucket
  an engine."""
  if sum(policy.tp) > gpus:
    raise ValueError(
      f"{gpus} rollout GPUs cannot hold one engine per bucket of degrees {policy.tp}"
    )
  out, left = [], gpus
  for b, (tp, share) in enumerate(zip(policy.tp, policy.gpu_share)):
    later = sum(policy.tp[b + 1 :])  # one engine for each later bucket, kept back
    n = left if b == len(policy.tp) - 1 else min(left - later, max(tp, round(share * gpus)))
    count = max(1, n // tp)
    out += [(b, tp)] * count
    left -= count * tp
  return out


def rollout(cluster: Cluster, policy: Policy, gpus: int, requests: list[dict]) -> dict:
  """Simulates one step's rollouts on ``gpus`` GPUs. Returns the makespan, the tokens decoded,
  each request's finish time and its bucket history (for the tests)."""
  engs = engines(policy, gpus)
  L = len(policy.tp)
  state = {
    r["id"]: {"turn": 0, "left": r["tokens"][0], "bucket": 0, "in_bucket": 0} for r in requests
  }
  by_id = {r["id"]: r for r in requests}
  queues = [[] for _ in range(L)]  # heaps of (enqueue order, id)
  order = 0
  for r in requests:
    heapq.heappush(queues[0], (order, r["id"]))
    order += 1
  held = [set() for _ in engs]  # rows in the engine's current decode step
  joining = [set() for _ in engs]  # rows given a slot during a step: in from the next
  busy = [False] * len(engs)
  events = []  # (time, seq, kind, payload)
  seq = 0
  history = {r["id"]: [0] for r in requests}
  finish, tokens, now = {}, 0, 0.0

  def push(t, kind, payload):
    nonlocal seq
    heapq.heappush(events, (t, seq, kind, payload))
    seq += 1

  def enqueue(rid):
    nonlocal order
    heapq.heappush(queues[state[rid]["bucket"]], (order, rid))
    order += 1

  def demote(rid):
    s = state[rid]
    if s["bucket"] < L - 1:
      s["bucket"] += 1
      history[rid].append(s["bucket"])
    s["in_bucket"] = 0

  def fill(e):
    """Free slots take queued requests of the engine's bucket, then of the buckets before it
    (newer requests), never of a later one (a demoted request waits for its own engines); an
    idle engine starts a step, a busy one lets them in at its next step."""
    bucket, tp = engs[e]
    room = cluster.slots * tp - len(held[e]) - len(joining[e])
    for b in range(bucket, -1, -1):  # own bucket, then the newer requests' buckets
      while room > 0 and queues[b]:
        joining[e].add(heapq.heappop(queues[b])[1])
        room -= 1
    if not busy[e] and (held[e] or joining[e]):
      held[e] |= joining[e]
      joining[e].clear()
      busy[e] = True
      push(now + step_time(cluster, tp, len(held[e])), "step", e)

  for e in range(len(engs)):
    fill(e)
  while events:
    now, _, kind, payload = heapq.heappop(events)
    if kind == "tool":
      enqueue(payload)
    else:
      e = payload
      busy[e] = False
      for rid in list(held[e]):
        s = state[rid]
        s["left"] -= 1
        s["in_bucket"] += 1
        tokens += 1
        if s["left"] == 0:  # the turn ends: done, or a tool call
          held[e].discard(rid)
          r = by_id[rid]
          if s["turn"] == len(r["tokens"]) - 1:
            finish[rid] = now
          else:
            push(now + r["tools"][s["turn"]], "tool", rid)
            s["turn"] += 1
            s["left"] = r["tokens"][s["turn"]]
            demote(rid)  # a tool return that continues: one bucket down
        elif s["in_bucket"] >= policy.quantum[s["bucket"]]:
          held[e].discard(rid)  # its quantum is spent: one bucket down, requeued
          demote(rid)
          enqueue(rid)
      held[e] |= joining[e]
      joining[e].clear()
      if held[e]:
        busy[e] = True
        push(now + step_time(cluster, engs[e][1], len(held[e])), "step", e)
    for e in range(len(engs)):
      fill(e)
  if len(finish) != len(requests):
    raise RuntimeError(
      f"{len(requests) - len(finish)} requests never finished: a bucket has no "
      "engine that serves it"
    )
  return {
    "makespan": max(finish.values()) if finish else 0.0,
    "tokens": tokens,
    "finish": finish,
    "history": history,
    "engines": engs,
  }


def fit_time(observations) -> tuple[float, float]:
  """``(x, y)`` of ``T(W) = x / W + y`` (y >= 0: the part more workers do not shorten, e.g. a
  rollout's critical path) by least squares over ``(W, T)`` observations; with one distinct
  ``W``, ``y = 0`` and ``x`` from the latest."""
  ws = np.asarray([w for w, _ in observations], float)
  ts = np.asarray([t for _, t in observations], float)
  if len(set(ws.tolist())) < 2:
    return float(ts[-1] * ws[-1]), 0.0
  A = np.stack([1.0 / ws, np.ones_like(ws)], axis=1)
  (x, y), *_ = np.linalg.lstsq(A, ts, rcond=None)
  if y < 0:  # no serial part: the pure 1/W fit
    x, y = float(np.sum(ts / ws) / np.sum(1.0 / ws**2)), 0.0
  return float(max(x, 0.0)), float(y)


def best_split(
  roll: tuple[float, float],
  train: tuple[float, float],
  gpus: int,
  *,
  lo: int = 1,
  current: int | None = None,
  max_move: int | None = None,
) -> int:
  """The rollout GPUs ``W_r`` in ``[lo, gpus - 1]`` (within ``max_move`` of ``current``)
  minimising ``max(T_roll(W_r), T_train(gpus - W_r))`` for fitted ``(x, y)`` models
  (:func:`fit_time`); ties: the fewer rollout GPUs."""
  options = range(lo, gpus)
  if current is not None and max_move is not None:
    options = [w for w in options if abs(w - current) <= max_move]
  t = lambda m, w: m[0] / w + m[1]
  return min(options, key=lambda w: (max(t(roll, w), t(train, gpus - w)), w))


def run(workload: Workload, cluster: Cluster, policy: Policy, seed: int) -> dict:
  """The whole run: per step its rollout GPUs, rollout and train times; the makespan (the last
  update's end) and the throughput (trajectories per second)."""
  rng = np.random.default_rng(seed)
  W = cluster.gpus
  w_r = policy.rollout_gpus
  if not sum(policy.tp) <= w_r <= W - 1:
    raise ValueError(
      f"Policy.rollout_gpus={w_r} must leave a GPU to training and hold one "
      f"engine per bucket: use {sum(policy.tp)} to {W - 1}"
    )
  roll_end, train_end = [], []
  splits, roll_times, train_times = [], [], []
  for k in range(workload.steps):
    requests = trajectories(rng, workload, k)
    splits.append(w_r)
    out = rollout(cluster, policy, w_r, requests)
    start = max(roll_end[-1] if roll_end else 0.0, train_end[-2] if len(train_end) > 1 else 0.0)
    roll_end.append(start + out["makespan"])
    t_train = out["tokens"] * cluster.train_s_per_token / (W - w_r)
    train_end.append(max(roll_end[-1], train_end[-1] if train_end else 0.0) + t_train)
    roll_times.append(out["makespan"])
    train_times.append(t_train)
    if policy.adaptive and (k + 1) % policy.plan_every == 0:
      window = slice(-policy.window, None)  # recent steps only: the workload drifts
      roll_fit = fit_time(list(zip(splits, roll_times))[window])
      train_fit = fit_time([(W - w, t) for w, t in zip(splits, train_times)][window])
      lo = sum(policy.tp)  # one engine per bucket
      w_r = best_split(roll_fit, train_fit, W, lo=lo, current=w_r, max_move=policy.max_move)
      if w_r == splits[-1] and len(set(splits[window])) == 1:
        w_r += -1 if w_r > lo else 1  # probe a neighbour, so the next fit tells x from y
        w_r = min(max(w_r, lo), W - 1)
  makespan = train_end[-1]
  return {
    "makespan_s": makespan,
    "throughput": workload.rows * workload.steps / makespan,
    "rollout_s": float(np.mean(roll_times)),
    "train_s": float(np.mean(train_times)),
    "splits": splits,
    "rollout_gpus_mean": float(np.mean(splits)),
  }
