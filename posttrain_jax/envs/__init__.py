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
# them, 'tron:<bucket>' the mix of one ability bucket, 'tron:no_<bucket>' all the others. SUITE maps a bucket to its task names.
_TASKS = make_tasks()
ENVS.update(_TASKS)
SUITE = buckets(_TASKS)
ENVS["tron"] = MixedEnv(list(_TASKS.values()), name="tron")
for _bucket, _names in SUITE.items():
  ENVS[f"tron:{_bucket}"] = MixedEnv([_TASKS[n] for n in _names], name=f"tron:{_bucket}")
  # Every task but this bucket's: train on it, evaluate generalisation on 'tron:<bucket>'.
  ENVS[f"tron:no_{_bucket}"] = MixedEnv([t for n, t in _TASKS.items() if n not in _names],
                                        name=f"tron:no_{_bucket}")

# Every character any registered task can emit.
CHARSET = "".join(sorted(set("".join(env.chars for env in ENVS.values()))))
# The characters of the first two tasks: the vocabulary of every arithmetic / countdown run, kept
# as it was before the suite existed so those runs (and their checkpoints) stay unchanged.
CORE_CHARSET = "".join(sorted(set(Arithmetic.chars + Countdown.chars)))


def tokenizer_charset(name: str) -> str:
  """The characters a new run on env ``name`` builds its char tokenizer from: the core set when
  the env's characters fit in it, else every registered task's."""
  chars = set(get_env(name).chars)
  return CORE_CHARSET if chars <= set(CORE_CHARSET) else CHARSET


def get_env(name: str):
  """``ENVS[name]``, or a ValueError listing the valid names."""
  if name not in ENVS:
    raise ValueError(f"unknown env {name!r}; valid env names: {', '.join(sorted(ENVS))}")
  return ENVS[name]


__all__ = ["CHARSET", "CORE_CHARSET", "ENVS", "SPLITS", "SUITE", "Arithmetic", "Countdown", "MixedEnv", "Problem",
           "StaticDataset", "TaskEnv", "get_env", "numpy_rng", "split_of",
           "tokenizer_charset"]
