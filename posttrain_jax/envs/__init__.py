"""Procedural verifiable tasks. ``ENVS`` maps a name to an environment instance.

Each environment has ``sample(key, n, *, level, split) -> [Problem]`` with disjoint 'train' and
'eval' splits, an exact ``verify(problem, completion) -> float`` that scores malformed text 0
without raising, ``corpus(key, n, *, level, noise)`` for pretraining, and its character set.
"""

from posttrain_jax.envs.arithmetic import Arithmetic
from posttrain_jax.envs.base import SPLITS, DatasetError, Problem, numpy_rng, split_of
from posttrain_jax.envs.catalogue import (CHARSET, CORE_CHARSET, ENVS, SUITE, get_env,
                                          tokenizer_charset)
from posttrain_jax.envs.countdown import Countdown
from posttrain_jax.envs.static import StaticDataset
from posttrain_jax.envs.suite import MixedEnv, TaskEnv, buckets, make_tasks

__all__ = ["CHARSET", "CORE_CHARSET", "ENVS", "SPLITS", "SUITE", "Arithmetic", "Countdown", "MixedEnv", "Problem",
           "StaticDataset", "TaskEnv", "get_env", "numpy_rng", "split_of",
           "tokenizer_charset"]
