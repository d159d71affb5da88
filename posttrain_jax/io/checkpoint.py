"""Orbax checkpoints of everything a run needs to resume.

A checkpoint holds a pytree ``state`` (parameters, optimiser state, step, keys, controller
states) and a JSON ``meta`` dict (host-side state: counters, trackers, config echo).

* Saves may be asynchronous (``async_save``): ``save`` returns once the arrays are copied off
  the devices and the files are written in the background. A save is finalised atomically
  (orbax writes to a temporary folder, writes ``commit_success.txt`` and renames it), and
  :meth:`Checkpointer.latest_step` only sees finalised steps, so a run killed mid-save resumes
  from the previous checkpoint. Step folders without the commit marker are deleted when a
  Checkpointer opens the directory.
* Every finalised step folder carries ``checksums.json`` (sha256 of each of its files), written
  once the save is finalised (before the next save, and by ``wait``/``close``; a step found
  without one when a Checkpointer opens the folder gets it then). ``restore`` verifies it; a
  step that fails (or cannot be read) raises CheckpointError with ``fallback=True``: with
  ``restore_latest(..., fallback=True)`` such a step is set aside (renamed ``N.corrupt``,
  nothing is deleted) and the previous one is restored instead.
* ``save`` refuses a state with a non-finite floating-point value (CheckpointError), so the
  kept checkpoints are finite and rotation never removes the last good one.
* In a multi-process run every process calls ``save`` and ``restore`` (each writes and reads
  its own shards; process 0 writes the metadata).
* ``restore`` places arrays as its target says: a target built on another mesh (or with
  ``jax.ShapeDtypeStruct`` shardings) restores onto that mesh; :func:`restore_single_device`
  restores onto one device (e.g. for export).
"""

import hashlib
import json
import os
import shutil

import jax
import orbax.checkpoint as ocp
from absl import logging
from jax.experimental import multihost_utils

from posttrain_jax.io import disk_full

COMMIT_MARKER = "commit_success.txt"
MANIFEST = "checksums.json"
CORRUPT_SUFFIX = ".corrupt"
FALLBACK_FLAG = "--fallback_checkpoint"


class CheckpointError(RuntimeError):
  """A checkpoint is missing, unreadable, or does not match the run restoring it.

  ``fallback``: the checkpoint's bytes are bad (checksum or read failure) and the run can fall
  back to the previous one (``restore_latest(..., fallback=True)``; on the command line
  ``--fallback_checkpoint``)."""

  def __init__(self, message: str, *, fallback: bool = False, problem: str = ""):
    super().__init__(message)
    self.fallback = fallback
    self.problem = problem  # with ``fallback``: what is wrong with the bytes, without advice


def _digests(path: str) -> dict[str, str]:
  """sha256 of every file under ``path`` (relative path -> hex digest), the manifest excluded."""
  out = {}
  for root, _, files in os.walk(path):
    for name in files:
      full = os.path.join(root, name)
      rel = os.path.relpath(full, path)
      if rel in (MANIFEST, MANIFEST + ".tmp"):
        continue
      digest = hashlib.sha256()
      with open(full, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
          digest.update(block)
      out[rel] = digest.hexdigest()
  return out


def seal(step_dir: str) -> None:
  """Writes ``step_dir/checksums.json`` (atomically) unless it is there."""
  manifest = os.path.join(step_dir, MANIFEST)
  if os.path.exists(manifest):
    return
  digests = _digests(step_dir)
  tmp = manifest + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(digests, f, indent=0, sort_keys=True)
  os.replace(tmp, manifest)


def checksum_problem(step_dir: str) -> str | None:
  """What differs between ``step_dir``'s files and its manifest (None when they agree)."""
  try:
    with open(os.path.join(step_dir, MANIFEST), encoding="utf-8") as f:
      want = json.load(f)
  except (OSError, ValueError) as e:
    return f"its {MANIFEST} is unreadable ({type(e).__name__})"
  got = _digests(step_dir)
  missing = sorted(set(want) - set(got))
  if missing:
    return f"{missing[0]} is missing"
  changed = sorted(k for k in want if want[k] != got[k])
  if changed:
    return f"{changed[0]} changed since it was saved (sha256 mismatch)"
  return None


def _floating(x) -> bool:
  return hasattr(x, "dtype") and jax.numpy.issubdtype(x.dtype, jax.numpy.floating)


@jax.jit
def _finite(leaves):
  return jax.numpy.all(jax.numpy.stack([jax.numpy.all(jax.numpy.isfinite(x)) for x in leaves]))


def all_finite(tree) -> bool:
  """Whether every floating-point array of ``tree`` is finite (one device reduction)."""
  leaves = [x for x in jax.tree.leaves(tree) if _floating(x)]
  return bool(_finite(leaves)) if leaves else True


def set_aside(path: str) -> str:
  """Renames ``path`` to ``path.corrupt`` (``.corrupt.1``, ... if taken); returns the new path."""
  target, n = path + CORRUPT_SUFFIX, 0
  while os.path.exists(target):
    n += 1
    target = f"{path}{CORRUPT_SUFFIX}.{n}"
  os.replace(path, target)
  return target


def _step_dirs(directory: str) -> dict[int, str]:
  if not os.path.isdir(directory):
    return {}
  return {
    int(name): os.path.join(directory, name)
    for name in os.listdir(directory)
    if name.isdigit() and os.path.isdir(os.path.join(directory, name))
  }


def finalised_steps(directory: str) -> list[int]:
  """Steps under ``directory`` whose save finished (the folder holds the commit marker)."""
  return sorted(
    s
    for s, path in _step_dirs(directory).items()
    if os.path.exists(os.path.join(path, COMMIT_MARKER))
  )


def _tidy(directory: str) -> None:
  """Deletes step folders of interrupted saves and seals finalised ones that have no manifest
  (a run killed between the two); process 0, every process waits for it."""
  if jax.process_index() == 0:
    done = set(finalised_steps(directory))
    for step, path in _step_dirs(directory).items():
      if step not in done:
        shutil.rmtree(path, ignore_errors=True)
      else:
        try:
          seal(path)
        except OSError:  # a read-only folder (e.g. exported): restored unverified
          pass
  _sync(f"checkpoint_tidy:{directory}")


def _sync(name: str) -> None:
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


class Checkpointer:
  """Keeps the last ``max_to_keep`` checkpoints of one stage under ``directory``."""

  def __init__(self, directory: str, *, max_to_keep: int = 2, async_save: bool = False):
    self.directory = os.path.abspath(directory)
    _tidy(self.directory)
    self._max_to_keep, self._async = max_to_keep, async_save
    self._manager = self._open()

  def _open(self) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(
      max_to_keep=self._max_to_keep, create=True, enable_async_checkpointing=self._async
    )
    handlers = {"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}
    return ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

  def latest_step(self) -> int | None:
    """The newest finalised step (None when there is none)."""
    steps = self.all_steps()
    return steps[-1] if steps else None

  def all_steps(self) -> list[int]:
    """Finalised steps, oldest first (an asynchronous save in flight is not among them)."""
    return finalised_steps(self.directory)

  def save(self, step: int, state, meta: dict | None = None, *, force: bool = True) -> None:
    """Saves ``state`` and ``meta`` as ``step`` (in the background with ``async_save``).

    Raises CheckpointError, writing nothing, when ``state`` holds a non-finite value."""
    if not all_finite(state):
      kept = self.latest_step()
      raise CheckpointError(
        f"refusing to write checkpoint {step} to {self.directory}: the state holds non-finite "
        f"values (NaN or inf); the last good checkpoint ({'none' if kept is None else kept}) "
        "is kept"
      )
    self._seal_finalised()  # the save in flight is finalised first
    if jax.process_count() == 1:  # processes that disagreed would wait for each other
      disk_full.require_space(self.directory, disk_full.tree_nbytes(state))
    self._manager.save(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta or {})
      ),
      force=force,
    )

  def _seal_finalised(self) -> None:
    """Waits for a save in flight, then writes the manifest of every finalised step."""
    self._manager.wait_until_finished()
    if jax.process_index() == 0:
      for step in self.all_steps():
        seal(os.path.join(self.directory, str(step)))
    _sync(f"checkpoint_seal:{self.directory}")

  def restore_latest(self, target, *, fallback: bool = False):
    """``(state, meta)`` of the newest checkpoint (see :meth:`restore`), None when there is none.

    ``fallback``: a newest step that fails its checksum or cannot be read is set aside
    (renamed ``N.corrupt``) and the one before it is tried, down to none (None: the stage
    starts over); without, such a step raises CheckpointError."""
    while self.latest_step() is not None:
      try:
        return self.restore(target)
      except CheckpointError as e:
        if not (fallback and e.fallback):
          raise
        self.set_aside(self.latest_step())
    return None

  def set_aside(self, step: int) -> str:
    """Renames step folder ``step`` to ``N.corrupt`` (nothing is deleted); returns its path."""
    self._manager.wait_until_finished()
    path = os.path.join(self.directory, str(step))
    moved = path
    if jax.process_index() == 0:
      moved = set_aside(path)
      logging.warning("checkpoint %s set aside as %s", path, moved)
    _sync(f"checkpoint_aside:{path}")
    self._manager.close()
    self._manager = self._open()
    return moved

  def restore(self, target, step: int | None = None):
    """Restores ``(state, meta)`` at ``step`` (default latest) with the structure of ``target``.

    ``target`` is a pytree of arrays or ``jax.ShapeDtypeStruct``; each leaf is restored with
    that leaf's sharding, so a target placed on another mesh (or on one device) reshards the
    checkpoint onto it. Raises CheckpointError naming the folder and the fix when it cannot be
    read.
    """
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    return self._restore(ocp.args.StandardRestore(abstract), step)

  def restore_metadata(self, step: int | None = None):
    """The saved ``state`` tree's array metadata (shapes, dtypes), no values."""
    step = self._step(step)
    return self._manager.item_metadata(step)["state"]

  def _step(self, step):
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(
        f"no checkpoint in {self.directory}; run the stage that writes it "
        "first, or point --workdir at a run that has one"
      )
    return step

  def _restore(self, state_args, step):
    step = self._step(step)
    path = os.path.join(self.directory, str(step))
    problem = checksum_problem(path)
    if problem is not None:
      raise CheckpointError(
        f"checkpoint {path} is corrupt: {problem}; {_fallback_advice(path)}",
        fallback=True,
        problem=problem,
      )
    try:
      restored = self._manager.restore(
        step, args=ocp.args.Composite(state=state_args, meta=ocp.args.JsonRestore())
      )
    except Exception as e:  # orbax raises many types for one condition: unreadable data
      cause = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
      if self._other_shapes(step, state_args.item):
        raise CheckpointError(
          f"checkpoint {path} holds arrays of other shapes than this run's ({cause}): the "
          "workdir was made with another model config (config.model); rerun with that "
          "config, or pass a fresh --workdir to start this one"
        ) from e
      raise CheckpointError(
        f"checkpoint {path} is unreadable ({cause}); {_fallback_advice(path)}",
        fallback=True,
        problem=f"unreadable ({cause})",
      ) from e
    return restored.state, dict(restored.meta)

  def _other_shapes(self, step: int, target) -> bool:
    """Whether the arrays saved at ``step`` have other shapes than ``target``'s (another model),
    as far as the checkpoint's metadata can be read."""
    try:
      saved = self._manager.item_metadata(step)["state"]
    except Exception:  # pylint: disable=broad-except  (metadata unreadable: not a shape issue)
      return False
    shapes = lambda tree: sorted(
      tuple(x.shape) for x in jax.tree.leaves(tree) if hasattr(x, "shape")
    )
    return shapes(saved) != shapes(target)

  def wait(self) -> None:
    self._seal_finalised()

  def close(self) -> None:
    self._seal_finalised()
    self._manager.close()


def _fallback_advice(path: str) -> str:
  return (
    f"rerun the same command with {FALLBACK_FLAG} to set it aside (renamed to "
    f"{os.path.basename(path)}{CORRUPT_SUFFIX}, nothing is deleted) and continue from "
    "the previous checkpoint"
  )


def restore_single_device(
  directory: str, target=None, *, step: int | None = None, device: jax.Device | None = None
):
  """``(state, meta)`` of the checkpoint in ``directory`` with every array on one device.

  ``target`` gives the structure (arrays or ShapeDtypeStructs; their shardings are ignored);
  without it the tree is rebuilt from the checkpoint's metadata (nested dicts of arrays).
  """
  sharding = jax.sharding.SingleDeviceSharding(device or jax.local_devices()[0])
  one = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
  ckpt = Checkpointer(directory, max_to_keep=None)
  try:
    tree = ckpt.restore_metadata(step) if target is None else target
    abstract = jax.tree.map(one, tree)
    return ckpt._restore(ocp.args.StandardRestore(abstract), step)  # pylint: disable=protected-access
  finally:
    ckpt.close()


def restore_params_single_device(
  path: str, *, step: int | None = None, device: jax.Device | None = None
) -> dict:
  """The parameters saved under ``path`` as nested dicts of arrays on one device, e.g. to
  export them: ``path`` is a stage's ``final`` folder (parameters) or its ``checkpoints``
  folder (a train state, whose ``params``, or an RL run state, whose ``policy.params``)."""
  state, _ = restore_single_device(path, step=step, device=device)
  if isinstance(state, dict) and "policy" in state:
    state = state["policy"]
  if isinstance(state, dict) and "params" in state and "opt_state" in state:
    state = state["params"]
  return _strip_value_keys(state)


def _strip_value_keys(tree):
  """nnx Variables save as ``{'value': array}``; returns the plain nested dict of arrays."""
  if isinstance(tree, dict):
    if set(tree) == {"value"}:
      return tree["value"]
    return {k: _strip_value_keys(v) for k, v in tree.items()}
  return tree
