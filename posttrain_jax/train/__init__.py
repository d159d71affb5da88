"""The engine: train state, jitted steps, stage loops (pretrain/SFT, RL), evaluation, the
stages of an experiment. Runs are started through ``posttrain_jax.methods.run``, which hands the
engine the METHODS table."""

from posttrain_jax.train.context import TrainingError
from posttrain_jax.train.state import TrainState, init_state, make_optimizer
from posttrain_jax.train.validate import ConfigError

__all__ = [
  "ConfigError",
  "TrainState",
  "TrainingError",
  "init_state",
  "make_optimizer",
]
