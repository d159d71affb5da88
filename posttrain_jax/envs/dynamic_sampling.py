"""DAPO dynamic sampling: keep only groups with a learning signal, refill, bounded rounds.

DAPO (Yu et al. 2025, "DAPO: an open-source LLM RL system at scale", section 3.2) trains only on
prompts whose G rollouts disagree,

  0 < |{ o_i : is_equivalent(a, o_i) }| < G,

because a group whose rewards are all equal has zero group-relative advantage and gives no policy
gradient. It over-samples and keeps drawing until the batch is full of such groups. TRON uses it
for its streams ("TRON-DAPO"), where saturated or impossible levels produce all-equal groups.

Here the draw and the scoring are callables, so this is pure host-side logic, deterministic given
them and testable without a model. The number of draw rounds is bounded: if the batch is not full
after ``max_rounds`` draws, what was kept is returned and ``stats['short']`` says how many groups
are missing (a trainer may then pad with zero-signal groups or train on a smaller batch).
"""

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np


class DynamicSample(NamedTuple):
  """Kept groups (at most ``target_groups``), their rewards ``[G]`` each, and counters."""

  groups: list
  rewards: list
  stats: dict


def zero_signal(rewards, *, atol: float = 0.0) -> np.ndarray:
  """True for groups whose rewards are all equal (within ``atol``).

  Args:
    rewards: ``[P, G]`` rewards, or a sequence of per-group reward sequences (ragged allowed).
  Returns:
    bool ``[P]``.
  """
  if isinstance(rewards, np.ndarray) and rewards.ndim == 2:
    return (rewards.max(axis=1) - rewards.min(axis=1)) <= atol
  out = []
  for group in rewards:
    g = np.asarray(group, dtype=np.float64).ravel()
    out.append(g.size == 0 or bool(g.max() - g.min() <= atol))
  return np.asarray(out, dtype=bool)


def dynamic_sample(
  draw_fn: Callable[[int, int], Sequence[Any]],
  score_fn: Callable[[Sequence[Any]], Sequence[Sequence[float]]],
  target_groups: int,
  max_rounds: int,
  *,
  oversample: float = 1.0,
  atol: float = 0.0,
) -> DynamicSample:
  """Draws groups until ``target_groups`` have non-equal rewards or ``max_rounds`` draws ran.

  Args:
    draw_fn: ``(round, n) -> n groups`` (e.g. n prompts with G rollouts each); ``round``
      counts from 0 so the caller can derive a fresh key with ``fold_in(key, round)``.
    score_fn: ``groups -> rewards``, one reward sequence ``[G]`` per group (one call per round,
      so a batched verifier runs once per round).
    target_groups: groups wanted (``>= 1``).
    max_rounds: total draw rounds allowed, the first included (``>= 1``).
    oversample: each round requests ``ceil(missing * oversample)`` groups (``>= 1``).
    atol: rewards within ``atol`` of each other count as equal.
  Returns:
    ``DynamicSample(groups, rewards, stats)`` with the first ``target_groups`` kept groups in
    draw order and stats ``rounds, drawn, kept, dropped, dropped_all_max, dropped_all_min,
    short, keep_rate``; ``dropped_all_max``/``dropped_all_min`` count zero-signal groups
    whose common reward is 1 / 0 (solved / unsolved at this level).
  """
  if target_groups < 1 or max_rounds < 1 or not oversample >= 1.0:
    raise ValueError(
      f"need target_groups >= 1, max_rounds >= 1, oversample >= 1; got "
      f"{target_groups}, {max_rounds}, {oversample}"
    )
  kept, kept_rewards = [], []
  stats = {"rounds": 0, "drawn": 0, "dropped": 0, "dropped_all_max": 0, "dropped_all_min": 0}
  while len(kept) < target_groups and stats["rounds"] < max_rounds:
    n = math.ceil((target_groups - len(kept)) * oversample)
    groups = list(draw_fn(stats["rounds"], n))
    rewards = list(score_fn(groups))
    if len(rewards) != len(groups):
      raise ValueError(f"score_fn returned {len(rewards)} reward groups for {len(groups)} groups")
    stats["rounds"] += 1
    stats["drawn"] += len(groups)
    flat = zero_signal(rewards, atol=atol) if groups else np.zeros(0, bool)
    for group, reward, dead in zip(groups, rewards, flat):
      if dead:
        stats["dropped"] += 1
        r = np.asarray(reward, dtype=np.float64).ravel()
        if r.size and r[0] >= 1.0:
          stats["dropped_all_max"] += 1
        elif r.size and r[0] <= 0.0:
          stats["dropped_all_min"] += 1
      else:
        kept.append(group)
        kept_rewards.append(np.asarray(reward, dtype=np.float64))
  kept, kept_rewards = kept[:target_groups], kept_rewards[:target_groups]
  stats["kept"] = len(kept)
  stats["short"] = target_groups - len(kept)
  stats["keep_rate"] = (stats["drawn"] - stats["dropped"]) / max(stats["drawn"], 1)
  return DynamicSample(kept, kept_rewards, stats)
