"""Checkpoints (orbax), metric writers (JSONL, TensorBoard), plots and progress."""

from posttrain_jax.io.checkpoint import Checkpointer, CheckpointError
from posttrain_jax.io.metrics import DamagedFileError, MetricWriter, read_jsonl
from posttrain_jax.io.plots import plot_curves
from posttrain_jax.io.progress import Progress, format_table, write_report

__all__ = [
  "CheckpointError",
  "Checkpointer",
  "DamagedFileError",
  "MetricWriter",
  "Progress",
  "format_table",
  "plot_curves",
  "read_jsonl",
  "write_report",
]
