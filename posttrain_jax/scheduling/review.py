"""Correct-set turnover and retention-aware review (arXiv 2606.03087; research/methods_A.md
section 10). The abstract gives the ideas; every rule below is **derived**.

- Correct set: ``C = {p : acc(p) >= tau}`` with ``acc(p)`` the group-mean reward of prompt p at
  its last visit (``tau = 1``: all rollouts right). A prompt is *mastered* once it was ever in C.
- Turnover between two snapshots (epochs) of C:
  acquired ``A = C_now \\ C_before``, regressed ``G = C_before \\ C_now``, retained
  ``K = C_before ∩ C_now``. They are pairwise disjoint, ``A ∪ K = C_now``, ``G ∪ K = C_before``,
  so ``|C_now| = |C_before| + |A| - |G|``; retention = ``|K| / |C_before|``.
- Review (pre-rollout batch replacement): ``k = floor(rho P)`` slots of each batch of ``P``
  prompts, drawn uniformly, are replaced by mastered prompts (not already in the batch) whose
  last success lies inside the repair window, ``d_min <= t - last_success <= d_max``; regressed
  ones (last visit wrong) first, then the largest delay, ties broken by the rng. The batch size
  and the rollouts per prompt are unchanged, so review costs zero extra rollouts. When fewer
  than ``k`` prompts qualify only those are placed; ``rho = 0`` leaves the batch untouched.
- Baseline ``mode='uniform'``: the same ``k`` slots get prompts drawn uniformly without
  replacement from a FIFO pool of the last ``pool_size`` distinct past prompts.
- :func:`restoration_episodes` / :func:`repair_curve`: the repair-window measurement (restoration
  cost against review delay) over the visit events that :func:`observe` returns.

The state is a JSON-safe dict and every function is pure (a new state is returned).
"""

import copy
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from posttrain_jax.envs import static as envs_static
from posttrain_jax.scheduling import base

VERSION = 1
MODES = ("review", "uniform")
# prompts: uid -> [acc at last visit, last_seen step, last_success step (-1: never),
#                  mastered (0/1), correct at last visit (0/1)]
ACC, SEEN, SUCCESS, MASTERED, CORRECT = range(5)


def init(
  *,
  mode: str = "review",
  rho: float = 0.125,
  d_min: int = 1,
  d_max: int = 8,
  tau: float = 1.0,
  pool_size: int = 4096,
) -> dict:
  """A fresh review state (``mode`` 'review' or the 'uniform' replay baseline)."""
  if mode not in MODES:
    raise ValueError(f"unknown review mode {mode!r}; valid: {', '.join(MODES)}")
  if not 0.0 <= rho <= 1.0 or not 0 <= d_min <= d_max or not 0.0 < tau <= 1.0 or pool_size < 1:
    raise ValueError("need 0 <= rho <= 1, 0 <= d_min <= d_max, 0 < tau <= 1, pool_size >= 1")
  config = {
    "mode": mode,
    "rho": float(rho),
    "d_min": int(d_min),
    "d_max": int(d_max),
    "tau": float(tau),
    "pool_size": int(pool_size),
  }
  return {
    "version": VERSION,
    "config": config,
    "prompts": {},
    "records": {},
    "pool": [],
    "snapshot": [],
    "epoch": 0,
    "epoch_start": 0,
  }


def _record(problem):
  return problem if isinstance(problem, str) else envs_static.problem_to_record(problem)


def _problem(record):
  return record if isinstance(record, str) else envs_static.record_to_problem(record)[0]


def correct_set(state: dict) -> set[str]:
  """Uids whose last visit was correct."""
  return {u for u, e in state["prompts"].items() if e[CORRECT]}


def mastered_set(state: dict) -> set[str]:
  """Uids that were ever correct."""
  return {u for u, e in state["prompts"].items() if e[MASTERED]}


class Turnover(NamedTuple):
  acquired: frozenset
  regressed: frozenset
  retained: frozenset


def turnover(before: Iterable[str], now: Iterable[str]) -> Turnover:
  """Acquired ``now \\ before``, regressed ``before \\ now``, retained ``before ∩ now``."""
  before, now = frozenset(before), frozenset(now)
  return Turnover(now - before, before - now, before & now)


def turnover_metrics(t: Turnover, prefix: str = "turnover") -> dict[str, float]:
  before = len(t.regressed) + len(t.retained)
  return {
    f"{prefix}/acquired": float(len(t.acquired)),
    f"{prefix}/regressed": float(len(t.regressed)),
    f"{prefix}/retained": float(len(t.retained)),
    f"{prefix}/retention": len(t.retained) / before if before else float("nan"),
  }


def observe(state: dict, step: int, problems: Sequence, successes, trials):
  """Records this step's visits (pure).

  Args:
    state: a review state.
    step: the trainer step of the visit.
    problems: [P] Problems or uids that were rolled out (repeats are pooled).
    successes: [P] summed rewards in [0, 1] of each prompt's valid rollouts.
    trials: [P] valid rollouts of each prompt (prompts with 0 are skipped).
  Returns:
    (new state, events, metrics). ``events`` has one dict per visited uid: ``step, uid, acc,
    correct, was_correct`` (None when first seen) and ``rollouts``, the input of
    :func:`restoration_episodes`.
  """
  cfg = state["config"]
  new = {
    **state,
    "prompts": dict(state["prompts"]),
    "records": dict(state["records"]),
    "pool": list(state["pool"]),
  }
  pooled: dict[str, list] = {}
  for p, s, n in zip(problems, np.asarray(successes, float), np.asarray(trials, float)):
    slot = pooled.setdefault(base.uid_of(p), [p, 0.0, 0.0])
    slot[1] += s
    slot[2] += n
  events, before = [], set()
  for uid, (p, s, n) in pooled.items():
    if n <= 0:
      continue
    old = new["prompts"].get(uid)
    acc = s / n
    correct = acc >= cfg["tau"] - 1e-9
    entry = [
      acc,
      step,
      step if correct else (old[SUCCESS] if old else -1),
      int(correct or (old is not None and old[MASTERED])),
      int(correct),
    ]
    new["prompts"][uid] = entry
    was = None if old is None else bool(old[CORRECT])
    before.update([uid] if was else [])
    events.append(
      {
        "step": int(step),
        "uid": uid,
        "acc": float(acc),
        "correct": bool(correct),
        "was_correct": was,
        "rollouts": int(round(n)),
      }
    )
    if cfg["mode"] == "review" and entry[MASTERED]:
      new["records"][uid] = _record(p)
    elif cfg["mode"] == "uniform" and uid not in new["records"]:
      new["records"][uid] = _record(p)
      new["pool"].append(uid)
  if cfg["mode"] == "uniform":
    for uid in new["pool"][: -cfg["pool_size"]]:
      del new["records"][uid]
    new["pool"] = new["pool"][-cfg["pool_size"] :]
  visit = turnover(before, {e["uid"] for e in events if e["correct"]})
  metrics = {
    **turnover_metrics(visit, "review/visit"),
    "review/correct": float(sum(e[CORRECT] for e in new["prompts"].values())),
    "review/mastered": float(sum(e[MASTERED] for e in new["prompts"].values())),
  }
  return new, events, metrics


def close_epoch(state: dict, step: int) -> tuple[dict, dict]:
  """Turnover of the correct set since the last epoch boundary; starts a new epoch (pure)."""
  now = correct_set(state)
  metrics = turnover_metrics(turnover(state["snapshot"], now))
  metrics["turnover/correct"] = float(len(now))
  new = {**state, "snapshot": sorted(now), "epoch": state["epoch"] + 1, "epoch_start": int(step)}
  return new, metrics


def review_candidates(state: dict, step: int, exclude: Iterable[str] = ()) -> list[str]:
  """Mastered uids inside the repair window, not in ``exclude``, as ``(regressed first,
  larger delay first, uid)``; the caller breaks ties at random (see :func:`replace`)."""
  cfg, exclude = state["config"], set(exclude)
  out = []
  for uid, e in state["prompts"].items():
    delay = step - e[SUCCESS]
    if e[MASTERED] and uid not in exclude and cfg["d_min"] <= delay <= cfg["d_max"]:
      out.append((-int(not e[CORRECT]), -delay, uid))
  return [uid for *_, uid in sorted(out)]


def replace(state: dict, step: int, problems: Sequence, rng):
  """Pre-rollout batch replacement (pure; see module doc).

  Args:
    state: a review state.
    step: the step the batch is for.
    problems: [P] candidate Problems (or uids).
    rng: numpy Generator or JAX key.
  Returns:
    (problems [P], positions [k] int64 of the replaced slots, metrics).
  """
  cfg, rng = state["config"], base.as_generator(rng)
  P = len(problems)
  k = int(np.floor(cfg["rho"] * P + 1e-9))
  in_batch = {base.uid_of(p) for p in problems}
  if cfg["mode"] == "review":
    cands = review_candidates(state, step, in_batch)
    key = {
      u: (-int(not state["prompts"][u][CORRECT]), -(step - state["prompts"][u][SUCCESS]))
      for u in cands
    }
    shuffled = [cands[i] for i in rng.permutation(len(cands))]
    chosen = sorted(shuffled, key=key.__getitem__)[:k]  # stable: random ties
  else:
    cands = [u for u in state["pool"] if u not in in_batch]
    n = min(k, len(cands))
    chosen = [cands[i] for i in rng.choice(len(cands), size=n, replace=False)] if n else []
  positions = (
    np.sort(rng.choice(P, size=len(chosen), replace=False)) if chosen else (np.zeros(0, np.int64))
  )
  out = list(problems)
  for pos, uid in zip(positions, chosen):
    out[pos] = _problem(state["records"][uid])
  metrics = {
    "review/replaced": float(len(chosen)),
    "review/slots": float(k),
    "review/candidates": float(len(cands)),
  }
  return out, positions.astype(np.int64), metrics


def check_state(state) -> dict:
  if not isinstance(state, dict) or state.get("version") != VERSION:
    raise ValueError(f"not a review state of version {VERSION}: {str(state)[:200]}")
  missing = {"config", "prompts", "records", "pool", "snapshot", "epoch", "epoch_start"} - set(
    state
  )
  if missing:
    raise ValueError(f"review state lacks {sorted(missing)}")
  return state


def restoration_episodes(events: Iterable[dict]) -> list[dict]:
  """Repair-window episodes from visit events (derived measurement).

  For every correct visit of a prompt at step ``s`` followed by a next visit at ``v1``, the
  review delay is ``d = v1 - s``. If ``v1`` is correct the prompt was retained (``regressed =
  False``, zero cost). Otherwise it regressed and the restoration cost runs from ``v1`` to the
  first later correct visit ``v_k``: ``visits = k`` (v1..v_k inclusive), ``steps = v_k - v1``,
  ``rollouts`` summed over v1..v_k; with no correct visit after it, ``restored = False`` and the
  costs are censored at the last visit. Episodes do not overlap: the next starts at ``v_k``.

  Args:
    events: dicts with ``step``, ``uid``, ``correct`` and ``rollouts`` (as :func:`observe`
      returns; any order).
  Returns:
    one dict per episode: ``uid, success_step, delay, regressed, restored, visits, steps,
    rollouts``.
  """
  by_uid: dict[str, list] = {}
  for e in events:
    by_uid.setdefault(e["uid"], []).append(e)
  out = []
  for uid in sorted(by_uid):
    visits = sorted(by_uid[uid], key=lambda e: e["step"])
    i = 0
    while i < len(visits) - 1:
      if not visits[i]["correct"]:
        i += 1
        continue
      s, j = visits[i]["step"], i + 1
      ep = {
        "uid": uid,
        "success_step": s,
        "delay": visits[j]["step"] - s,
        "regressed": not visits[j]["correct"],
        "restored": True,
        "visits": 0,
        "steps": 0,
        "rollouts": 0,
      }
      if ep["regressed"]:
        end = next((m for m in range(j + 1, len(visits)) if visits[m]["correct"]), None)
        ep["restored"] = end is not None
        end = len(visits) - 1 if end is None else end
        ep["visits"] = end - j + 1
        ep["steps"] = visits[end]["step"] - visits[j]["step"]
        ep["rollouts"] = sum(int(v["rollouts"]) for v in visits[j : end + 1])
        j = end
      out.append(ep)
      i = j
  return out


def repair_curve(episodes: Iterable[dict], edges: Sequence[int]) -> list[dict]:
  """Restoration cost against review delay: one row per delay bin ``[edges[i], edges[i+1])``.

  Each row: ``d_lo, d_hi, episodes, regression_rate`` and, over the regressed episodes that were
  restored, ``restored, mean_visits, mean_steps, mean_rollouts`` (NaN when none).
  """
  episodes = list(episodes)
  rows = []
  for lo, hi in zip(edges[:-1], edges[1:]):
    eps = [e for e in episodes if lo <= e["delay"] < hi]
    reg = [e for e in eps if e["regressed"]]
    done = [e for e in reg if e["restored"]]
    mean = lambda key: float(np.mean([e[key] for e in done])) if done else float("nan")
    rows.append(
      {
        "d_lo": lo,
        "d_hi": hi,
        "episodes": len(eps),
        "regression_rate": len(reg) / len(eps) if eps else float("nan"),
        "restored": len(done),
        "mean_visits": mean("visits"),
        "mean_steps": mean("steps"),
        "mean_rollouts": mean("rollouts"),
      }
    )
  return rows


class Review(base.Scheduler):
  """Retention-aware review (``mode='review'``) or its uniform-replay baseline behind the
  scheduler protocol. ``epoch_steps > 0`` closes a turnover epoch every that many steps."""

  logs_events = True  # the visit events of the repair-window measurement

  def __init__(self, *, group_size: int, mode: str = "review", epoch_steps: int = 0, **config):
    super().__init__(group_size=group_size)
    self.name = "review" if mode == "review" else "uniform_review"
    self.epoch_steps = int(epoch_steps)
    self.state = init(mode=mode, **config)
    self.last_events: list[dict] = []

  def select(self, step, problems, rng):
    out, _, metrics = replace(self.state, step, problems, rng)
    return base.uniform_selection(out, self.group_size, metrics)

  def observe(self, step, problems, rewards, group, valid, *, advantages=None):
    del advantages
    succ, trials = base.group_means(rewards, group, valid, len(problems))
    self.state, self.last_events, metrics = observe(self.state, step, problems, succ, trials)
    if self.epoch_steps and step + 1 - self.state["epoch_start"] >= self.epoch_steps:
      self.state, epoch_metrics = close_epoch(self.state, step + 1)
      metrics.update(epoch_metrics)
    return metrics

  def events(self) -> list[dict]:
    return list(self.last_events)

  def close_epoch(self, step: int) -> dict:
    """Ends a turnover epoch now (for trainers that count epochs themselves)."""
    self.state, metrics = close_epoch(self.state, step)
    return metrics

  def state_dict(self):
    return {"meta": {"name": self.name, "review": self.state}, "arrays": {}}

  def load_state_dict(self, state):
    super().load_state_dict(state)
    self.state = check_state(copy.deepcopy(state["meta"]["review"]))
