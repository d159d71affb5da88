"""What every prompt scheduler shares: the :class:`Selection` it returns, row layouts for
variable group sizes, host randomness, and the plain :class:`Uniform` scheduler (fixed ``G``).

Shapes: ``P`` prompts, ``G`` rollouts per prompt, ``R`` rows of the generation batch
(``R = P * G_max`` for the padded layout). Everything here is host-side numpy, never inside jit.
"""

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from posttrain_jax.envs import base as envs_base


def as_generator(rng) -> np.random.Generator:
  """A numpy Generator from a Generator (returned as is), a JAX key or an int seed."""
  if isinstance(rng, np.random.Generator):
    return rng
  if isinstance(rng, (int, np.integer)):
    return np.random.default_rng(int(rng))
  if isinstance(rng, jax.Array):
    return envs_base.numpy_rng(rng)
  raise TypeError(f"need a numpy Generator, a JAX key or an int seed, got {type(rng).__name__}")


def uid_of(problem) -> str:
  """``problem.uid`` for a Problem, the string itself for a uid."""
  return problem if isinstance(problem, str) else problem.uid


def padded_layout(group_sizes, g_max: int) -> tuple[np.ndarray, np.ndarray]:
  """Rows of ``P`` prompts padded to ``G_max`` each: a static ``R = P * G_max`` shape.

  Row ``p * G_max + j`` belongs to prompt ``p`` and is real iff ``j < n_p``.

  Args:
    group_sizes: [P] int rollouts per prompt, ``0 <= n_p <= g_max``.
    g_max: static maximum group size.
  Returns:
    (group [P*G_max] int32 prompt index, valid [P*G_max] float32 row mask).
  """
  sizes = np.asarray(group_sizes, np.int64)
  if sizes.ndim != 1 or np.any(sizes < 0) or np.any(sizes > g_max):
    raise ValueError(f"group sizes must be a [P] vector in [0, {g_max}], got {sizes}")
  group = np.repeat(np.arange(len(sizes), dtype=np.int32), g_max)
  valid = (np.tile(np.arange(g_max), len(sizes)) < np.repeat(sizes, g_max)).astype(np.float32)
  return group, valid


def packed_layout(group_sizes, rows: int) -> tuple[np.ndarray, np.ndarray]:
  """Rows of ``P`` prompts packed back to back into a static ``rows`` (e.g. the budget).

  Prompt ``p`` owns rows ``[sum(n[:p]), sum(n[:p+1]))``; the rows after ``sum(n)`` are padding
  (``valid = 0``, ``group = 0``). Cheaper than :func:`padded_layout` when ``G_max >> G_mean``.

  Returns:
    (group [rows] int32, valid [rows] float32).
  """
  sizes = np.asarray(group_sizes, np.int64)
  if sizes.ndim != 1 or np.any(sizes < 0) or sizes.sum() > rows:
    raise ValueError(f"group sizes {sizes} do not fit in {rows} rows")
  group = np.zeros(rows, np.int32)
  used = int(sizes.sum())
  group[:used] = np.repeat(np.arange(len(sizes), dtype=np.int32), sizes)
  valid = (np.arange(rows) < used).astype(np.float32)
  return group, valid


class Selection(NamedTuple):
  """What a scheduler's ``select`` returns: the prompts of this step and their rows.

  Attributes:
    problems: [P] the prompts to generate for (slot order; ``P`` = number of candidates).
    group_sizes: [P] int32 real rollouts per prompt.
    group: [R] int32 prompt slot of each generation row (``AdvantageInputs.group``).
    valid: [R] float32, 1 for a real row, 0 for padding (``AdvantageInputs.valid``).
    metrics: flat ``/``-namespaced scalars about the choice.
  """

  problems: list
  group_sizes: np.ndarray
  group: np.ndarray
  valid: np.ndarray
  metrics: dict

  @property
  def rows(self) -> int:
    return len(self.group)

  def row_problems(self) -> list:
    """[R] the problem of every row (padding rows repeat their slot's problem)."""
    return [self.problems[g] for g in self.group]

  def row_uids(self) -> list[str]:
    return [uid_of(p) for p in self.row_problems()]


def uniform_selection(problems: Sequence, group_size: int, metrics=None) -> Selection:
  """``group_size`` rollouts for every prompt: today's GRPO batch, all rows valid."""
  sizes = np.full(len(problems), group_size, np.int32)
  group, valid = padded_layout(sizes, group_size)
  return Selection(list(problems), sizes, group, valid, dict(metrics or {}))


class Composed(NamedTuple):
  """What ``compose`` returns: the train rows (fresh, then replayed), their uids, metrics."""

  rows: dict
  uids: list | None
  metrics: dict


def group_means(rewards, group, valid, num_groups: int) -> tuple[np.ndarray, np.ndarray]:
  """Per-prompt ``(sum of rewards clipped to [0, 1] over valid rows, valid count)``, each [P]."""
  rewards = np.clip(np.asarray(rewards, np.float64), 0.0, 1.0)
  group = np.asarray(group, np.int64)
  valid = np.asarray(valid, np.float64)
  if not rewards.shape == group.shape == valid.shape or rewards.ndim != 1:
    raise ValueError(
      f"rewards {rewards.shape}, group {group.shape} and valid {valid.shape} "
      "must be equal [R] vectors"
    )
  succ = np.bincount(group, weights=rewards * valid, minlength=num_groups)[:num_groups]
  count = np.bincount(group, weights=valid, minlength=num_groups)[:num_groups]
  return succ, count


class Scheduler:
  """The common protocol (see the package docstring for when a trainer calls what).

  The base class is the ``uniform`` scheduler: ``group_size`` rollouts for every candidate,
  no replay, no state. Subclasses override what they need.
  """

  name = "uniform"
  logs_events = False  # whether observe() leaves events for the run's event log

  def __init__(self, *, group_size: int):
    if group_size < 1:
      raise ValueError(f"group_size must be >= 1, got {group_size}")
    self.group_size = int(group_size)

  def select(self, step: int, problems: Sequence, rng) -> Selection:
    """Before generation: the prompts to roll out and their rows."""
    del step, rng
    return uniform_selection(problems, self.group_size)

  def compose(
    self, step: int, rows: Mapping[str, np.ndarray], rng, uids: Sequence[str] | None = None
  ) -> Composed:
    """After advantages: the train rows (identity unless the scheduler replays)."""
    del step, rng
    return Composed(dict(rows), None if uids is None else list(uids), {})

  def observe(
    self, step: int, problems: Sequence, rewards, group, valid, *, advantages=None
  ) -> dict:
    """After scoring: update trackers/posteriors. Returns flat metrics."""
    del step, problems, rewards, group, valid, advantages
    return {}

  def events(self) -> list[dict]:
    """After ``observe``: the events it produced (each with its ``step``), which the trainer
    appends to the run's event log when ``logs_events`` (e.g. review's visit events)."""
    return []

  def state_dict(self) -> dict[str, Any]:
    """``{"meta": JSON-safe dict, "arrays": nested dict of numpy arrays}``."""
    return {"meta": {"name": self.name}, "arrays": {}}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    meta = state.get("meta", {})
    if meta.get("name") != self.name:
      raise ValueError(f"state of scheduler {meta.get('name')!r} loaded into {self.name!r}")


class Uniform(Scheduler):
  """Fixed ``G`` per prompt (GRPO's batch): the ``none`` / ``uniform`` scheduler."""

  name = "uniform"
