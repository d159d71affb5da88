"""Many runs: reproduction tables (arms x seeds, statistics)."""

from posttrain_jax.sweeps import report, runner, stats
from posttrain_jax.sweeps.reproduce import reproduce

__all__ = ["report", "reproduce", "runner", "stats"]
