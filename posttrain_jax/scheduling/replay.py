"""Replay buffers for GRPO-style training, host-side numpy (DESIGN.md section 3, step 6).

:class:`RolloutReplay` — rollout-level, advantage-prioritised, age-capped replay (Yoo et al.,
arXiv 2606.04560; research/methods_A.md section 7; mechanism from the paper's pages, details
derived):

- it stores *individual* rollouts ``(tokens, masks, behaviour log-probs, advantage A_i, reward,
  prompt uid, policy_version, step_born)``; ``A_i`` is computed once in the rollout's own group
  and never recomputed; a rollout with ``|A_i| <= zero_tol`` is never stored;
- age eviction: at step ``t`` every entry with ``t - step_born > tau_max`` is removed, so no
  replayed rollout is older than ``tau_max`` steps (and none is younger than 1: a step never
  replays its own fresh rollouts);
- fresh-anchored composition: batch = all fresh rows of this step ++ ``M`` replayed rows drawn
  separately, ``M = replay_count`` or ``round(replay_fraction * R)`` (static; missing replay rows
  are padding with ``valid = 0``);
- priority: draw without replacement with ``P(i) ∝ |A_i|^α`` (successive draws, α = 1 default).
  For token-level advantages ``[B, T]`` the priority is the masked mean of ``|A|``.
- optionally an entry is evicted after ``max_replays`` replays.

:class:`GroupReplay` — the naive baseline arm: whole groups (every valid row of a prompt's
group, zero-advantage ones included) are stored, FIFO up to ``capacity`` groups, no age cap by
default, and drawn uniformly without replacement (whole groups that fit in the ``M`` rows).

Rows are plain dicts of ``[R, ...]`` host numpy arrays: the :class:`Rollout` fields
(:func:`rows_from_rollout`) plus ``advantages`` and ``valid`` (required) and e.g. ``rewards``.
``compose`` adds ``is_replay [R+M] float32`` and ``age [R+M] int32`` (0 for fresh rows). Replayed
rows keep the ``group`` ids of their original batch: a trainer must not recompute advantages
over the composed rows. ``state_dict`` is numpy arrays + JSON meta (np.savez or orbax).
"""

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from posttrain_jax.registry import lookup
from posttrain_jax.rollout.types import Rollout
from posttrain_jax.scheduling import base

VERSION = 1
_COUNTERS = ("stored", "evicted", "dropped_zero", "replayed")


def rows_from_rollout(ro: Rollout, **extra) -> dict[str, np.ndarray]:
  """A host rows dict of a (host-fetched) Rollout's fields plus ``extra`` arrays (optional
  fields that are None, e.g. ``routes`` of a dense model, are left out)."""
  rows = {
    f.name: np.asarray(getattr(ro, f.name))
    for f in dataclasses.fields(Rollout)
    if getattr(ro, f.name) is not None
  }
  rows.update({k: np.asarray(v) for k, v in extra.items()})
  return rows


def rollout_from_rows(rows: Mapping[str, np.ndarray]) -> Rollout:
  """The Rollout part of a rows dict (numpy arrays; put them on device for the train step)."""
  return Rollout(
    **{
      f.name: rows[f.name]
      for f in dataclasses.fields(Rollout)
      if f.name in rows or f.default is dataclasses.MISSING
    }
  )


def _check_rows(rows: Mapping) -> int:
  for key in ("advantages", "valid"):
    if key not in rows:
      raise ValueError(f"replay rows need {key!r}; got keys {sorted(rows)}")
  sizes = {k: np.shape(v)[0] if np.ndim(v) else None for k, v in rows.items()}
  if len(set(sizes.values())) != 1 or None in sizes.values():
    raise ValueError(f"replay rows must share one leading dimension, got {sizes}")
  return next(iter(sizes.values()))


def priority(rows: Mapping[str, np.ndarray]) -> np.ndarray:
  """[R] ``|A|`` (or the completion-mask mean of ``|A|`` for ``[R, T]`` advantages)."""
  adv = np.abs(np.asarray(rows["advantages"], np.float64))
  if adv.ndim == 1:
    return adv
  mask = rows.get("completion_mask")
  if mask is not None and np.shape(mask) == adv.shape:
    mask = np.asarray(mask, np.float64)
    return (adv * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1.0)
  return adv.reshape(len(adv), -1).mean(axis=1)


class _Store:
  """Rows in insertion order: fields ``[N, ...]`` plus per-row bookkeeping."""

  def __init__(self):
    self.fields: dict | None = None
    self.born = np.zeros(0, np.int64)
    self.replays = np.zeros(0, np.int64)
    self.gid = np.zeros(0, np.int64)
    self.priority = np.zeros(0, np.float64)
    self.uids: list[str] = []

  def __len__(self):
    return len(self.born)

  def append(self, fields, born: int, gid, prio, uids):
    n = len(gid)
    if self.fields is None:
      self.fields = {k: np.asarray(v)[:0] for k, v in fields.items()}
    if set(fields) != set(self.fields):
      raise ValueError(f"rows have keys {sorted(fields)}, the buffer holds {sorted(self.fields)}")
    for k, v in fields.items():
      v = np.asarray(v)
      if v.shape[1:] != self.fields[k].shape[1:]:
        raise ValueError(
          f"rows[{k!r}] has shape {v.shape[1:]} per row, the buffer holds "
          f"{self.fields[k].shape[1:]}; keep prompt/completion lengths fixed"
        )
      self.fields[k] = np.concatenate([self.fields[k], v.astype(self.fields[k].dtype)])
    self.born = np.concatenate([self.born, np.full(n, born, np.int64)])
    self.replays = np.concatenate([self.replays, np.zeros(n, np.int64)])
    self.gid = np.concatenate([self.gid, np.asarray(gid, np.int64)])
    self.priority = np.concatenate([self.priority, np.asarray(prio, np.float64)])
    self.uids.extend(uids)

  def keep(self, mask) -> int:
    """Keeps rows where ``mask``; returns how many were removed."""
    mask = np.asarray(mask, bool)
    if self.fields is not None:
      self.fields = {k: v[mask] for k, v in self.fields.items()}
    for name in ("born", "replays", "gid", "priority"):
      setattr(self, name, getattr(self, name)[mask])
    self.uids = [u for u, m in zip(self.uids, mask) if m]
    return int((~mask).sum())

  def state(self, pad_to: int | None) -> tuple[dict, dict]:
    n = len(self)
    pad = n if pad_to is None else int(pad_to)
    if pad < n:
      raise ValueError(f"buffer holds {n} rows, more than pad_to={pad}")
    grow = lambda x: np.concatenate([x, np.zeros((pad - n,) + x.shape[1:], x.dtype)])
    arrays = {name: grow(getattr(self, name)) for name in ("born", "replays", "gid", "priority")}
    arrays["used"] = (np.arange(pad) < n).astype(np.int8)
    arrays["rows"] = {k: grow(v) for k, v in (self.fields or {}).items()}
    schema = (
      None
      if self.fields is None
      else {k: [str(v.dtype), list(v.shape[1:])] for k, v in self.fields.items()}
    )
    return arrays, {"uids": list(self.uids), "schema": schema}

  def load(self, arrays, meta):
    used = np.asarray(arrays["used"]).astype(bool)
    schema = meta["schema"]
    self.fields = (
      None
      if schema is None
      else {
        k: np.asarray(arrays["rows"][k])
        .astype(schema[k][0])[used]
        .reshape((-1,) + tuple(schema[k][1]))
        for k in schema
      }
    )
    for name, dtype in (
      ("born", np.int64),
      ("replays", np.int64),
      ("gid", np.int64),
      ("priority", np.float64),
    ):
      setattr(self, name, np.asarray(arrays[name], dtype)[used])
    self.uids = list(meta["uids"])
    if len(self.uids) != len(self.born):
      raise ValueError("replay state: uids and rows disagree")


class _Buffer:
  """Shared eviction, composition and state of both buffers."""

  kind = ""

  def __init__(
    self,
    *,
    tau_max: int | None,
    replay_count: int | None,
    replay_fraction: float,
    capacity: int | None,
    **extra,
  ):
    if tau_max is not None and tau_max < 1:
      raise ValueError(f"tau_max must be >= 1 (or None), got {tau_max}")
    if replay_count is not None and replay_count < 0 or replay_fraction < 0:
      raise ValueError("replay_count and replay_fraction must be >= 0")
    self.config = {
      "tau_max": tau_max,
      "replay_count": replay_count,
      "replay_fraction": float(replay_fraction),
      "capacity": capacity,
      **extra,
    }
    self.store = _Store()
    self.next_gid = 0
    self.counters = {k: 0 for k in _COUNTERS}

  def replay_rows(self, fresh_rows: int) -> int:
    """``M``, the static number of replay rows appended to ``fresh_rows`` fresh ones."""
    count = self.config["replay_count"]
    return (
      int(count) if count is not None else int(round(self.config["replay_fraction"] * fresh_rows))
    )

  def evict(self, step: int) -> None:
    """Drops entries older than ``tau_max`` (and over ``max_replays`` where set)."""
    keep = np.ones(len(self.store), bool)
    if self.config["tau_max"] is not None:
      keep &= step - self.store.born <= self.config["tau_max"]
    if self.config.get("max_replays") is not None:
      keep &= self.store.replays < self.config["max_replays"]
    self.counters["evicted"] += self.store.keep(keep)

  def _draw(self, step: int, count: int, rng: np.random.Generator) -> np.ndarray:
    raise NotImplementedError

  def add(self, step: int, rows: Mapping, uids: Sequence[str] | None = None) -> None:
    raise NotImplementedError

  def sample(self, step: int, count: int, rng) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Evicts, then draws up to ``count`` stored rows for ``step`` (counted as replayed).

    Returns:
      (indices into the store, rows dict of the drawn rows; empty when nothing is stored).
    """
    self.evict(step)
    if not count or self.store.fields is None:
      return np.zeros(0, np.int64), {}
    idx = self._draw(step, count, base.as_generator(rng))
    self.store.replays[idx] += 1
    self.counters["replayed"] += len(idx)
    return idx, {k: v[idx] for k, v in self.store.fields.items()}

  def compose(
    self, step: int, rows: Mapping[str, np.ndarray], rng, uids: Sequence[str] | None = None
  ) -> base.Composed:
    """Fresh rows ++ ``M`` replayed rows of earlier steps; then stores the fresh rows.

    Args:
      step: the trainer step (ages are counted in these).
      rows: [R, ...] fresh host rows with ``advantages`` and ``valid``.
      rng: numpy Generator or JAX key (fold the step in for a resumable run).
      uids: [R] prompt uid of each fresh row (stored for diagnostics), optional.
    Returns:
      Composed(rows [R+M, ...] with ``is_replay`` and ``age``, uids or None, metrics).
    """
    fresh = {k: np.asarray(v) for k, v in rows.items()}
    R = _check_rows(fresh)
    if self.store.fields is not None and set(fresh) != set(self.store.fields):
      raise ValueError(
        f"rows have keys {sorted(fresh)}, the buffer holds {sorted(self.store.fields)}"
      )
    M = self.replay_rows(R)
    idx, drawn = self.sample(step, M, rng)
    pad = M - len(idx)
    out = {}
    for k, v in fresh.items():
      old = drawn[k] if len(idx) else np.zeros((0,) + v.shape[1:], v.dtype)
      out[k] = np.concatenate([v, old.astype(v.dtype), np.zeros((pad,) + v.shape[1:], v.dtype)])
    ages = step - self.store.born[idx]
    out["is_replay"] = np.concatenate([np.zeros(R), np.ones(len(idx)), np.zeros(pad)]).astype(
      np.float32
    )
    out["age"] = np.concatenate([np.zeros(R), ages, np.zeros(pad)]).astype(np.int32)
    out_uids = None
    if uids is not None:
      out_uids = list(uids) + [self.store.uids[i] for i in idx] + [""] * pad
    self.add(step, fresh, uids)
    metrics = {
      "replay/size": float(len(self.store)),
      "replay/rows": float(len(idx)),
      "replay/fill": len(idx) / M if M else 0.0,
      "replay/age_mean": float(ages.mean()) if len(idx) else 0.0,
      **{f"replay/{k}": float(v) for k, v in self.counters.items()},
    }
    return base.Composed(out, out_uids, metrics)

  def state_dict(self, pad_to: int | None = None) -> tuple[dict, dict]:
    """``(arrays, meta)``; ``pad_to`` rows gives static shapes (an orbax restore target)."""
    arrays, meta = self.store.state(pad_to)
    meta.update(
      {
        "version": VERSION,
        "kind": self.kind,
        "config": dict(self.config),
        "next_gid": self.next_gid,
        "counters": dict(self.counters),
      }
    )
    return arrays, meta

  def load_state_dict(self, arrays: Mapping, meta: Mapping) -> None:
    if meta.get("version") != VERSION or meta.get("kind") != self.kind:
      raise ValueError(f"not a {self.kind} replay state of version {VERSION}")
    if dict(meta["config"]) != self.config:
      raise ValueError(f"replay state config {meta['config']} differs from {self.config}")
    self.store.load(arrays, meta)
    self.next_gid = int(meta["next_gid"])
    self.counters = {k: int(meta["counters"][k]) for k in _COUNTERS}


class RolloutReplay(_Buffer):
  """Rollout-level, |A|-prioritised, age-capped, fresh-anchored replay (see module doc)."""

  kind = "rollout"

  def __init__(
    self,
    *,
    tau_max: int = 4,
    replay_count: int | None = None,
    replay_fraction: float = 0.25,
    alpha: float = 1.0,
    max_replays: int | None = None,
    zero_tol: float = 1e-8,
  ):
    if tau_max is None:
      raise ValueError("rollout-level replay needs an age cap tau_max >= 1")
    if alpha < 0 or zero_tol < 0:
      raise ValueError("need alpha >= 0 and zero_tol >= 0")
    super().__init__(
      tau_max=tau_max,
      replay_count=replay_count,
      replay_fraction=replay_fraction,
      capacity=None,
      alpha=float(alpha),
      max_replays=max_replays,
      zero_tol=float(zero_tol),
    )

  def add(self, step, rows, uids=None):
    """Stores the valid rows with ``|A| > zero_tol`` (one entry per rollout)."""
    prio = priority(rows)
    ok = (np.asarray(rows["valid"]) > 0) & (prio > self.config["zero_tol"])
    self.counters["dropped_zero"] += int(((np.asarray(rows["valid"]) > 0) & ~ok).sum())
    self.counters["stored"] += int(ok.sum())
    if not ok.any():
      return
    n = int(ok.sum())
    uids = [""] * len(prio) if uids is None else list(uids)
    self.store.append(
      {k: np.asarray(v)[ok] for k, v in rows.items()},
      step,
      self.next_gid + np.arange(n),
      prio[ok],
      [u for u, m in zip(uids, ok) if m],
    )
    self.next_gid += n

  def _draw(self, step, count, rng):
    elig = np.nonzero(self.store.born < step)[0]
    k = min(count, len(elig))
    if k == 0:
      return np.zeros(0, np.int64)
    w = self.store.priority[elig] ** self.config["alpha"]
    return rng.choice(elig, size=k, replace=False, p=w / w.sum())


class GroupReplay(_Buffer):
  """Naive group-level replay: whole groups, FIFO ``capacity`` groups, uniform draws."""

  kind = "group"

  def __init__(
    self,
    *,
    tau_max: int | None = None,
    replay_count: int | None = None,
    replay_fraction: float = 0.25,
    capacity: int = 256,
  ):
    if capacity < 1:
      raise ValueError(f"capacity (groups) must be >= 1, got {capacity}")
    super().__init__(
      tau_max=tau_max,
      replay_count=replay_count,
      replay_fraction=replay_fraction,
      capacity=int(capacity),
    )

  def add(self, step, rows, uids=None):
    """Stores every valid row, grouped by ``rows['group']``; evicts the oldest groups."""
    if "group" not in rows:
      raise ValueError("group-level replay needs rows['group']")
    ok = np.asarray(rows["valid"]) > 0
    group = np.asarray(rows["group"])[ok]
    _, gid = np.unique(group, return_inverse=True)
    uids = [""] * len(ok) if uids is None else list(uids)
    self.store.append(
      {k: np.asarray(v)[ok] for k, v in rows.items()},
      step,
      self.next_gid + gid,
      priority(rows)[ok],
      [u for u, m in zip(uids, ok) if m],
    )
    self.next_gid += int(gid.max()) + 1 if len(gid) else 0
    self.counters["stored"] += int(ok.sum())
    live = np.unique(self.store.gid)
    if len(live) > self.config["capacity"]:
      cut = live[-self.config["capacity"]]
      self.counters["evicted"] += self.store.keep(self.store.gid >= cut)

  def _draw(self, step, count, rng):
    elig = self.store.born < step
    gids = np.unique(self.store.gid[elig])
    picked, left = [], count
    for g in gids[rng.permutation(len(gids))]:
      rows = np.nonzero(self.store.gid == g)[0]
      if len(rows) <= left:
        picked.append(rows)
        left -= len(rows)
      if left == 0:
        break
    return np.concatenate(picked) if picked else np.zeros(0, np.int64)


BUFFERS = {"rollout": RolloutReplay, "group": GroupReplay}


class Replay(base.Scheduler):
  """A replay buffer behind the scheduler protocol: uniform ``G`` prompts, replay in
  ``compose`` (which also stores the fresh rows; ``observe`` has nothing to do).

  ``state_rows`` pads the saved arrays to a static row count (``>= (tau_max + 1) * R`` for the
  rollout buffer, ``>=`` the stored rows for the group one), so once the buffer has seen rows
  every checkpoint has the same tree for an orbax ``StandardRestore`` target; the ``rows``
  subtree is empty before the first rows, so restore targets are best built from the saved
  metadata (``io.checkpoint.restore_single_device(..., target=None)``) or use np.savez.
  """

  def __init__(
    self, *, group_size: int, buffer: str = "rollout", state_rows: int | None = None, **config
  ):
    super().__init__(group_size=group_size)
    self.name = f"{buffer}_replay"
    self.buffer = lookup(BUFFERS, buffer, "replay buffer")(**config)
    self.state_rows = state_rows

  def compose(self, step, rows, rng, uids=None):
    return self.buffer.compose(step, rows, rng, uids)

  def state_dict(self):
    arrays, meta = self.buffer.state_dict(self.state_rows)
    return {"meta": {"name": self.name, "buffer": meta}, "arrays": arrays}

  def load_state_dict(self, state):
    super().load_state_dict(state)
    self.buffer.load_state_dict(state["arrays"], state["meta"]["buffer"])
