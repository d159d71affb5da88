"""Procedural verifiable tasks. ``ENVS`` maps a name to an environment instance.

Each environment has ``sample(key, n, *, level, split) -> [Problem]`` with disjoint 'train' and
'eval' splits, an exact ``verify(problem, completion) -> float`` that scores malformed text 0
without raising, ``corpus(key, n, *, level, noise)`` for pretraining, and its character set.
``CONTEXTS`` (envs/contexts.py) maps a name to a privileged-context builder: text a teacher
reads before the prompt (the answer, a hint, feedback on the student's attempt).
``TOOLS`` (envs/tools.py) maps a name to a tool an agent calls; ``ToolEnv`` (envs/agent.py)
plays a task over turns with tools (docs/agents.md).
"""

from posttrain_jax.envs import contexts
from posttrain_jax.envs.agent import AgentEnv, StepResult, ToolEnv, step_all
from posttrain_jax.envs.arithmetic import Arithmetic
from posttrain_jax.envs.base import SPLITS, DatasetError, Problem, numpy_rng, split_of
from posttrain_jax.envs.catalogue import (
  CHARSET,
  CORE_CHARSET,
  ENVS,
  SUITE,
  get_env,
  tokenizer_charset,
)
from posttrain_jax.envs.chain import Chain
from posttrain_jax.envs.contexts import CONTEXTS
from posttrain_jax.envs.countdown import Countdown
from posttrain_jax.envs.digit_sum import DigitSum
from posttrain_jax.envs.graph_path import GraphPath
from posttrain_jax.envs.long_mult import LongMult
from posttrain_jax.envs.static import StaticDataset
from posttrain_jax.envs.suite import MixedEnv, TaskEnv, buckets, make_tasks
from posttrain_jax.envs.tom import ToM
from posttrain_jax.envs.tools import TOOLS, Tool, make_tool, make_tools

__all__ = [
  "CHARSET",
  "CONTEXTS",
  "CORE_CHARSET",
  "DatasetError",
  "ENVS",
  "SPLITS",
  "SUITE",
  "TOOLS",
  "AgentEnv",
  "Arithmetic",
  "Chain",
  "Countdown",
  "DigitSum",
  "GraphPath",
  "LongMult",
  "MixedEnv",
  "Problem",
  "StaticDataset",
  "StepResult",
  "TaskEnv",
  "buckets",
  "ToM",
  "Tool",
  "ToolEnv",
  "contexts",
  "get_env",
  "make_tasks",
  "make_tool",
  "make_tools",
  "numpy_rng",
  "split_of",
  "step_all",
  "tokenizer_charset",
]
