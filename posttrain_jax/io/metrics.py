"""Metric writers: one JSON line per record and TensorBoard event files.

Records are flat dicts of ``/``-namespaced scalars plus ``step``. On resume a writer keeps only
the records up to the restored checkpoint's step, none when the stage starts over from step 0
(:meth:`MetricWriter.resume`), so a killed-and-resumed run writes the same file as an
uninterrupted one, wherever it was killed.
"""

import json
import math
import os

import numpy as np


def _scalar(value):
  value = np.asarray(value)
  if value.size != 1:
    raise ValueError(f"metric of shape {value.shape} is not a scalar")
  value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


def read_jsonl(path: str) -> list[dict]:
  """All records of a JSONL file ([] when the file does not exist); a torn last line is dropped."""
  if not os.path.exists(path):
    return []
  records = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        break
  return records


class MetricWriter:
  """Appends records to ``<directory>/<name>.jsonl`` and TensorBoard events in ``directory/tb``.

  ``enabled=False`` (every process but the first of a multi-process run) writes nothing.
  """

  def __init__(
    self, directory: str, name: str = "metrics", *, tensorboard: bool = True, enabled: bool = True
  ):
    os.makedirs(directory, exist_ok=True)
    self.path = os.path.join(directory, f"{name}.jsonl")
    self.enabled = enabled
    self._tb = None
    if tensorboard and enabled:
      from tensorboardX import SummaryWriter  # lazy: import costs ~1 s

      self._tb = SummaryWriter(os.path.join(directory, "tb", name), flush_secs=10)

  def truncate_after(self, step: int) -> None:
    """Drops records with ``step > step`` (used when resuming from a checkpoint at ``step``)."""
    if not self.enabled:
      return
    kept = [r for r in read_jsonl(self.path) if r.get("step", -1) <= step]
    tmp = self.path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      for r in kept:
        f.write(json.dumps(r) + "\n")
    os.replace(tmp, self.path)

  def resume(self, step: int) -> None:
    """Keeps the records a run resumed from a checkpoint at ``step`` has already written: those
    of steps <= ``step``, or none when ``step`` is 0 (no checkpoint: the stage starts over,
    its step-0 records included)."""
    self.truncate_after(step if step > 0 else -1)

  def write(self, step: int, metrics: dict) -> dict:
    record = {"step": int(step), **{k: _scalar(v) for k, v in metrics.items()}}
    if not self.enabled:
      return record
    with open(self.path, "a", encoding="utf-8") as f:
      f.write(json.dumps(record) + "\n")
    if self._tb is not None:
      for k, v in record.items():
        if k != "step" and isinstance(v, (int, float)):
          self._tb.add_scalar(k, v, step)
    return record

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
