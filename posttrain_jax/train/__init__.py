"""Training: train state, jitted steps, stage loops (pretrain/SFT, RL), evaluation, experiments."""

from posttrain_jax.train.context import TrainingError
from posttrain_jax.train.experiment import run
from posttrain_jax.train.state import TrainState, init_state, make_optimizer
from posttrain_jax.train.validate import STAGES, ConfigError, validate

__all__ = ["STAGES", "ConfigError", "TrainState", "TrainingError", "init_state",
           "make_optimizer", "run", "validate"]
