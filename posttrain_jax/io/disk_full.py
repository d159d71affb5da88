"""A full disk, wherever it surfaces: a plain ``OSError`` with ``errno.ENOSPC``, or a
checkpoint library's own error whose text carries the operating system's (tensorstore:
``No space left on device [os_error_code='28']``), found anywhere in an exception's chain of
causes; the one line that names the device; a log filter that keeps the background writers'
copies of that error off the console (the entry point reports it once); and
:func:`require_space`, which refuses a checkpoint the disk cannot hold before any of it is
written (no half-written folder, no background writer failing mid-save)."""

import errno
import logging
import os
import re
import shutil

import jax

_TEXT = ("No space left on device", f"os_error_code='{errno.ENOSPC}'")
_PATH = re.compile(r'(?:Failed writing|local file):? "([^"]+)"')


def _mentions_full_disk(text: str) -> bool:
  return any(t in text for t in _TEXT)


def full_disk_path(error: BaseException | None, default: str) -> str | None:
  """The path being written when ``error`` (or a cause or context of it) ran out of space,
  ``default`` when the error does not name one; None when no full disk is in the chain."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
      return os.fsdecode(error.filename) if error.filename else default
    if _mentions_full_disk(str(error)):
      found = _PATH.findall(str(error))
      return found[-1] if found else default
    error = error.__cause__ or error.__context__
  return None


def device_of(path: str) -> str:
  """``'DEVICE (FSTYPE) mounted at MOUNT'`` for the mount holding ``path`` (/proc/mounts),
  or the mount point alone where that table cannot be read."""
  mount = os.path.abspath(path)
  while not os.path.ismount(mount):
    mount = os.path.dirname(mount)
  try:
    with open("/proc/mounts", encoding="utf-8") as f:
      rows = [line.split() for line in f]
  except OSError:
    rows = []
  for row in rows:
    if len(row) > 2 and row[1] == mount:
      return f"{row[0]} ({row[2]}) mounted at {mount}"
  return mount


def message(path: str) -> str:
  """The user's line for a full disk while writing ``path``."""
  path = os.path.abspath(path)
  return (
    f"no space left on {device_of(path)} (writing {path}); free space and rerun the same command"
  )


class QuietFullDisk(logging.Filter):
  """Drops log records about a full disk (their text or their exception's)."""

  def filter(self, record: logging.LogRecord) -> bool:
    text = record.getMessage()
    if record.exc_info and record.exc_info[1] is not None:
      text += str(record.exc_info[1])
    return not _mentions_full_disk(text)


# Room a checkpoint needs beyond its arrays' bytes: metadata, manifests, temporary files.
MARGIN_FRACTION, MARGIN_BYTES = 0.05, 1 << 20


def tree_nbytes(tree) -> int:
  """Bytes of the arrays in ``tree`` (global sizes: an upper bound for one process's share)."""
  return sum(int(getattr(x, "nbytes", 0)) for x in jax.tree.leaves(tree))


def require_space(directory: str, nbytes: int) -> None:
  """OSError(ENOSPC) naming ``directory`` when its file system has less free space than a
  write of ``nbytes`` plus the margin needs."""
  existing = os.path.abspath(directory)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  free = shutil.disk_usage(existing).free
  need = int(nbytes * (1 + MARGIN_FRACTION)) + MARGIN_BYTES
  if free < need:
    raise OSError(
      errno.ENOSPC, f"No space left on device: {need} bytes needed, {free} free", directory
    )
