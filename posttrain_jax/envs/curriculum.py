"""Per-environment level curriculum for an online environment stream (TRON, arXiv 2606.01599).

The TRON abstract only says instances are drawn "at the difficulty level required by the current
curriculum"; the rule here is ours (research/methods_B.md section 1b). Each env has a current
level and a window of its most recent rewards *at that level*. After an ``update``, an env whose
window holds at least ``min_count`` rewards moves

  up   one level when   mean(window) > up    (strictly),
  down one level when   mean(window) < down  (strictly),

within its own levels, and its window is cleared on every move. Rewards for any other level
(stale rollouts drawn before a move) only update that level's running pass rate (an EMA with
decay ``ema_decay``, logged and used by ``weighting='learnability'``).

The state is a plain JSON-serialisable dict (string keys, lists, numbers), so it is checkpointed
with the rest of the host-side state, and every function is pure: ``update(state, outcomes)``
returns a new state and depends on nothing but its inputs. ``mix(state)`` gives the
``(env_name, level, weight)`` list that ``MixedEnv.sample(..., mix=...)`` takes.
"""

import copy
import math
from collections.abc import Iterable, Mapping, Sequence

VERSION = 1
WEIGHTINGS = ("uniform", "learnability")


def init(
  env_levels: Mapping[str, Sequence[int]],
  *,
  start: int | Mapping[str, int] | None = None,
  up: float = 0.8,
  down: float = 0.2,
  window: int = 32,
  min_count: int = 16,
  ema_decay: float = 0.9,
  weighting: str = "uniform",
  review: float = 0.0,
  min_weight: float = 0.05,
  base_weights: Mapping[str, float] | None = None,
) -> dict:
  """A fresh curriculum state.

  Args:
    env_levels: env name -> its levels in increasing difficulty (``MixedEnv.env_levels()``).
    start: starting level for all envs (clipped into each env's levels) or per env; default
      each env's easiest level.
    up, down: pass-rate thresholds, ``0 <= down < up <= 1``; a move needs a strict crossing.
    window: how many recent rewards at the current level are kept.
    min_count: rewards needed in the window before any move (``1 <= min_count <= window``).
    ema_decay: decay of the per-(env, level) running pass rate.
    weighting: 'uniform' (every env equal) or 'learnability' (weight ~ p(1-p) of the current
      level's running pass rate, floored at ``min_weight``; unseen levels count as p = 0.5).
    review: fraction of each env's weight given to the level below its current one.
    base_weights: env name -> multiplier of its weight (e.g. to balance buckets); default 1.
  """
  if not env_levels:
    raise ValueError("a curriculum needs at least one env")
  if not 0.0 <= down < up <= 1.0:
    raise ValueError(f"need 0 <= down < up <= 1, got down={down}, up={up}")
  if not 1 <= min_count <= window:
    raise ValueError(f"need 1 <= min_count <= window, got min_count={min_count}, window={window}")
  if weighting not in WEIGHTINGS:
    raise ValueError(f"unknown weighting {weighting!r}; valid: {', '.join(WEIGHTINGS)}")
  if not 0.0 <= review < 1.0 or not 0.0 < ema_decay < 1.0 or min_weight < 0:
    raise ValueError("need 0 <= review < 1, 0 < ema_decay < 1 and min_weight >= 0")
  base_weights = dict(base_weights or {})
  unknown = set(base_weights) - set(env_levels)
  if unknown:
    raise ValueError(f"base_weights name unknown envs: {sorted(unknown)}")
  envs = {}
  for name, levels in env_levels.items():
    levels = sorted(int(l) for l in levels)
    if not levels:
      raise ValueError(f"env {name!r} has no levels")
    first = (
      start.get(name, levels[0])
      if isinstance(start, Mapping)
      else (levels[0] if start is None else start)
    )
    level = min(max(int(first), levels[0]), levels[-1])
    if level not in levels:
      raise ValueError(f"start level {first} is not a level of {name!r}: {levels}")
    envs[str(name)] = {
      "levels": levels,
      "level": level,
      "window": [],
      "ema": {},
      "seen": {},
      "moves_up": 0,
      "moves_down": 0,
    }
  config = {
    "up": float(up),
    "down": float(down),
    "window": int(window),
    "min_count": int(min_count),
    "ema_decay": float(ema_decay),
    "weighting": weighting,
    "review": float(review),
    "min_weight": float(min_weight),
    "base_weights": {str(k): float(v) for k, v in base_weights.items()},
  }
  return {"version": VERSION, "config": config, "envs": envs, "updates": 0}


def _record(entry: dict, level: int, reward: float, decay: float) -> None:
  key = str(level)
  seen = entry["seen"].get(key, 0)
  old = entry["ema"].get(key)
  entry["ema"][key] = reward if old is None else decay * old + (1.0 - decay) * reward
  entry["seen"][key] = seen + 1


def _decide(entry: dict, config: dict) -> int:
  """-1, 0 or +1: the move the window asks for."""
  window = entry["window"]
  if len(window) < config["min_count"]:
    return 0
  rate = sum(window) / len(window)
  levels, pos = entry["levels"], entry["levels"].index(entry["level"])
  if rate > config["up"] and pos + 1 < len(levels):
    return 1
  if rate < config["down"] and pos > 0:
    return -1
  return 0


def update(state: dict, outcomes: Iterable[tuple[str, int, float]]) -> dict:
  """A new state after ``outcomes``: (env name, level the problem was drawn at, reward in
  [0, 1]) triples, e.g. ``[(p.env, p.level, r) for p, r in zip(problems, rewards)]``.
  Outcomes for envs the curriculum does not track raise a ValueError."""
  new = copy.deepcopy(state)
  config = new["config"]
  for name, level, reward in outcomes:
    entry = new["envs"].get(name)
    if entry is None:
      raise ValueError(f"curriculum has no env {name!r}; tracked: {', '.join(new['envs'])}")
    reward = float(reward)
    if not math.isfinite(reward):
      raise ValueError(f"non-finite reward {reward} for {name!r}")
    reward = min(max(reward, 0.0), 1.0)
    _record(entry, int(level), reward, config["ema_decay"])
    if int(level) == entry["level"]:
      entry["window"] = (entry["window"] + [reward])[-config["window"] :]
  for entry in new["envs"].values():
    move = _decide(entry, config)
    if move:
      entry["level"] = entry["levels"][entry["levels"].index(entry["level"]) + move]
      entry["window"] = []
      entry["moves_up" if move > 0 else "moves_down"] += 1
  new["updates"] = state["updates"] + 1
  return new


def levels(state: dict) -> dict[str, int]:
  """Env name -> current level."""
  return {name: entry["level"] for name, entry in state["envs"].items()}


def pass_rate(state: dict, name: str, level: int | None = None) -> float | None:
  """Running (EMA) pass rate of ``name`` at ``level`` (default: current), None if unseen."""
  entry = state["envs"][name]
  return entry["ema"].get(str(entry["level"] if level is None else level))


def mix(state: dict) -> list[tuple[str, int, float]]:
  """``[(env_name, level, weight)]`` for ``MixedEnv.sample(..., mix=...)``; weights sum to 1."""
  config = state["config"]
  out = []
  for name, entry in state["envs"].items():
    weight = config["base_weights"].get(name, 1.0)
    if config["weighting"] == "learnability":
      p = pass_rate(state, name)
      p = 0.5 if p is None else p
      weight *= max(p * (1.0 - p), config["min_weight"])
    pos = entry["levels"].index(entry["level"])
    if config["review"] > 0 and pos > 0:
      out.append((name, entry["levels"][pos - 1], weight * config["review"]))
      weight *= 1.0 - config["review"]
    out.append((name, entry["level"], weight))
  total = sum(w for _, _, w in out)
  if total <= 0:
    return [(n, l, 1.0 / len(out)) for n, l, _ in out]
  return [(n, l, w / total) for n, l, w in out]


def metrics(state: dict) -> dict[str, float]:
  """Flat scalars for logging: ``curriculum/<env>/level``, ``.../window_rate``, ``.../ema``."""
  out = {}
  for name, entry in state["envs"].items():
    out[f"curriculum/{name}/level"] = float(entry["level"])
    window = entry["window"]
    out[f"curriculum/{name}/window_rate"] = sum(window) / len(window) if window else float("nan")
    ema = pass_rate(state, name)
    out[f"curriculum/{name}/ema"] = float("nan") if ema is None else ema
  out["curriculum/mean_level"] = sum(e["level"] for e in state["envs"].values()) / len(
    state["envs"]
  )
  return out


def check_state(state) -> dict:
  """``state`` if it looks like a curriculum state of this version, else a ValueError."""
  if not isinstance(state, Mapping) or state.get("version") != VERSION:
    raise ValueError(f"not a curriculum state of version {VERSION}: {str(state)[:200]}")
  for key in ("config", "envs", "updates"):
    if key not in state:
      raise ValueError(f"curriculum state lacks {key!r}")
  for name, entry in state["envs"].items():
    if entry["level"] not in entry["levels"]:
      raise ValueError(
        f"curriculum state: {name!r} is at level {entry['level']} "
        f"outside its levels {entry['levels']}"
      )
  return dict(state)
