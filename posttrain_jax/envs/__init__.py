"""Procedural verifiable tasks. ``ENVS`` maps a name to an environment instance.

Each environment has ``sample(key, n, *, level, split) -> [Problem]`` with disjoint 'train' and
'eval' splits, an exact ``verify(problem, completion) -> float`` that scores malformed text 0
without raising, ``corpus(key, n, *, level, noise)`` for pretraining, and its character set.
"""

from posttrain_jax.envs.arithmetic import Arithmetic
from posttrain_jax.envs.base import SPLITS, Problem, numpy_rng, split_of
from posttrain_jax.envs.countdown import Countdown
from posttrain_jax.envs.static import StaticDataset
from posttrain_jax.envs.suite import MixedEnv, TaskEnv, buckets, make_tasks

ENVS = {
    "arithmetic": Arithmetic(),
    "countdown": Countdown(),
}

# The TRON-style suite (envs/suite): 'tron/<task>' single tasks, 'tron' the online mix of all of
# them, 'tron:<bucket>' the mix of one ability bucket. SUITE maps a bucket to its task names.
_TASKS = make_tasks()
ENVS.update(_TASKS)
SUITE = buckets(_TASKS)
ENVS["tron"] = MixedEnv(list(_TASKS.values()), name="tron")
for _bucket, _names in SUITE.items():
  ENVS[f"tron:{_bucket}"] = MixedEnv([_TASKS[n] for n in _names], name=f"tron:{_bucket}")

# Every character any registered task can emit; the default tokenizer covers all of them.
CHARSET = "".join(sorted(set("".join(env.chars for env in ENVS.values()))))


def get_env(name: str):
  """``ENVS[name]``, or a ValueError listing the valid names."""
  if name not in ENVS:
    raise ValueError(f"unknown env {name!r}; valid env names: {', '.join(sorted(ENVS))}")
  return ENVS[name]


__all__ = ["CHARSET", "ENVS", "SPLITS", "SUITE", "Arithmetic", "Countdown", "MixedEnv", "Problem",
           "StaticDataset", "TaskEnv", "get_env", "numpy_rng", "split_of"]
