"""A TRON-style suite of generator-verifier programs (arXiv 2606.01599), in five ability buckets.

Every task is registered as ``tron/<name>``; ``SUITE`` maps a bucket to its task names, and
``MixedEnv`` streams a weighted (env, level) mix of them (``tron`` = all buckets,
``tron:<bucket>`` = one bucket, for specialist models).
"""

from posttrain_jax.envs.suite.arith import ModSum, Mul, Sub
from posttrain_jax.envs.suite.core import PREFIX, TaskEnv
from posttrain_jax.envs.suite.counting import Count, Distinct, Runs
from posttrain_jax.envs.suite.logic import Bool, Max, Parity, Sort
from posttrain_jax.envs.suite.mixed import MixedEnv, clip_level
from posttrain_jax.envs.suite.pattern import Progression, Repeat, Reverse
from posttrain_jax.envs.suite.spatial import Grid, Manhattan, Visits

TASK_CLASSES = (
  Sub,
  Mul,
  ModSum,
  Count,
  Distinct,
  Runs,
  Progression,
  Repeat,
  Reverse,
  Grid,
  Manhattan,
  Visits,
  Max,
  Sort,
  Bool,
  Parity,
)


def make_tasks(eval_percent: int = 10) -> dict[str, TaskEnv]:
  """Fresh instances of every suite task, by registry name."""
  tasks = [cls(eval_percent=eval_percent) for cls in TASK_CLASSES]
  return {t.name: t for t in tasks}


def buckets(tasks) -> dict[str, list[str]]:
  """Bucket -> task names, in suite order."""
  out: dict[str, list[str]] = {}
  for t in tasks.values() if isinstance(tasks, dict) else tasks:
    out.setdefault(t.bucket, []).append(t.name)
  return out


__all__ = [
  "PREFIX",
  "TASK_CLASSES",
  "MixedEnv",
  "TaskEnv",
  "buckets",
  "clip_level",
  "make_tasks",
] + [cls.__name__ for cls in TASK_CLASSES]
