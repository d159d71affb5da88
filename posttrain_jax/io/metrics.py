"""Metric writers: one JSON line per record and TensorBoard event files.

Records are flat dicts of ``/``-namespaced scalars plus ``step``. On resume a writer keeps only
the records up to the restored checkpoint's step, none when the stage starts over from step 0
(:meth:`MetricWriter.resume`), so a killed-and-resumed run writes the same file (and the same
TensorBoard points, rebuilt from the kept records) as an uninterrupted one, wherever it was
killed. A crash can tear only the last line of the file; :func:`read_jsonl` drops that line
with a warning and refuses any other damage with one line.
"""

import json
import math
import os
import shutil
import sys

import numpy as np


def _scalar(value):
  value = np.asarray(value)
  if value.size != 1:
    raise ValueError(f"metric of shape {value.shape} is not a scalar")
  value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


class DamagedFileError(RuntimeError):
  """A file of the workdir is damaged where a crash cannot have damaged it (not its torn last
  record); the message names the file, the line and the fix."""


def read_jsonl(path: str) -> list[dict]:
  """All records of an append-only JSONL file ([] when the file does not exist).

  A torn last line (what a crash in the middle of an append leaves) is dropped, with a warning
  line naming the file; it is the only record a reader may drop. A damaged line with intact
  records after it cannot come from a crash in an append: :class:`DamagedFileError` names it.
  """
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8", errors="replace") as f:
    lines = f.read().split("\n")
  if lines and lines[-1] == "":
    lines.pop()  # the newline that ends the last record
  records = []
  for i, line in enumerate(lines):
    try:
      record = json.loads(line)
      if not isinstance(record, dict):
        raise ValueError(f"a JSON {type(record).__name__}, not a record")
      records.append(record)
    except ValueError as e:
      if i == len(lines) - 1:
        print(
          f"warning: {path}: dropped its torn last line {i + 1} (a crash while it was "
          "written); the run rewrites that record",
          file=sys.stderr,
          flush=True,
        )
        break
      raise DamagedFileError(
        f"{path}:{i + 1} is damaged ({e}) and {len(lines) - i - 1} intact record(s) follow it; "
        "a crash only tears the last line, so the file was changed by hand or the disk is "
        f"failing: delete line {i + 1} (its record is lost) and rerun the same command"
      ) from None
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
    self._tb_dir = os.path.join(directory, "tb", name) if tensorboard and enabled else None
    self._tb = self._open_tb() if self._tb_dir else None

  def _open_tb(self):
    from tensorboardX import SummaryWriter  # lazy: import costs ~1 s

    return SummaryWriter(self._tb_dir, flush_secs=10)

  def truncate_after(self, step: int) -> None:
    """Drops records with ``step > step`` (used when resuming from a checkpoint at ``step``).

    The JSONL file is rewritten atomically with the kept records, and the TensorBoard event log
    rebuilt from them, so both hold exactly one point per step after a resume."""
    if not self.enabled:
      return
    kept = [r for r in read_jsonl(self.path) if r.get("step", -1) <= step]
    tmp = self.path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      for r in kept:
        f.write(json.dumps(r) + "\n")
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, self.path)
    if self._tb is not None:  # derived from the records: rebuilt, not edited
      self._tb.close()
      shutil.rmtree(self._tb_dir, ignore_errors=True)
      self._tb = self._open_tb()
      for r in kept:
        self._add_scalars(r)

  def _add_scalars(self, record: dict) -> None:
    for k, v in record.items():
      if k != "step" and isinstance(v, (int, float)):
        self._tb.add_scalar(k, v, record["step"])

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
      self._add_scalars(record)
    return record

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
