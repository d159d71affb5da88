"""Orbax checkpoints of everything a run needs to resume.

A checkpoint holds a pytree ``state`` (parameters, optimiser state, step, keys, controller
states) and a JSON ``meta`` dict (host-side state: counters, trackers, config echo).

* Saves may be asynchronous (``async_save``): ``save`` returns once the arrays are copied off
  the devices and the files are written in the background. A save is finalised atomically
  (orbax writes to a temporary folder, writes ``commit_success.txt`` and renames it), and
  :meth:`Checkpointer.latest_step` only sees finalised steps, so a run killed mid-save resumes
  from the previous checkpoint. Step folders without the commit marker are deleted when a
  Checkpointer opens the directory.
* In a multi-process run every process calls ``save`` and ``restore`` (each writes and reads
  its own shards; process 0 writes the metadata).
* ``restore`` places arrays as its target says: a target built on another mesh (or with
  ``jax.ShapeDtypeStruct`` shardings) restores onto that mesh; :func:`restore_single_device`
  restores onto one device (e.g. for export).
"""

import os
import shutil

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from posttrain_jax.io import disk_full

COMMIT_MARKER = "commit_success.txt"


class CheckpointError(RuntimeError):
  """A checkpoint is missing, unreadable, or does not match the run restoring it."""


def _step_dirs(directory: str) -> dict[int, str]:
  if not os.path.isdir(directory):
    return {}
  return {int(name): os.path.join(directory, name) for name in os.listdir(directory)
          if name.isdigit() and os.path.isdir(os.path.join(directory, name))}


def finalised_steps(directory: str) -> list[int]:
  """Steps under ``directory`` whose save finished (the folder holds the commit marker)."""
  return sorted(s for s, path in _step_dirs(directory).items()
                if os.path.exists(os.path.join(path, COMMIT_MARKER)))


def _remove_unfinalised(directory: str) -> None:
  """Deletes step folders of interrupted saves (process 0; every process waits for it)."""
  if jax.process_index() == 0:
    done = set(finalised_steps(directory))
    for step, path in _step_dirs(directory).items():
      if step not in done:
        shutil.rmtree(path, ignore_errors=True)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(f"checkpoint_cleanup:{directory}")


class Checkpointer:
  """Keeps the last ``max_to_keep`` checkpoints of one stage under ``directory``."""

  def __init__(self, directory: str, *, max_to_keep: int = 2, async_save: bool = False):
    self.directory = os.path.abspath(directory)
    _remove_unfinalised(self.directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                           enable_async_checkpointing=async_save)
    handlers = {"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_handlers=handlers)

  def latest_step(self) -> int | None:
    """The newest finalised step (None when there is none)."""
    steps = self.all_steps()
    return steps[-1] if steps else None

  def all_steps(self) -> list[int]:
    """Finalised steps, oldest first (an asynchronous save in flight is not among them)."""
    return finalised_steps(self.directory)

  def save(self, step: int, state, meta: dict | None = None, *, force: bool = True) -> None:
    if jax.process_count() == 1:  # processes that disagreed would wait for each other
      try:
        disk_full.require_space(self.directory, disk_full.tree_nbytes(state))
      except OSError:
        self._manager.wait_until_finished()  # the save in flight is finalised before the stop
        raise
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta or {})), force=force)

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
      raise CheckpointError(f"no checkpoint in {self.directory}; run the stage that writes it "
                            "first, or point --workdir at a run that has one")
    return step

  def _restore(self, state_args, step):
    step = self._step(step)
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(
          state=state_args, meta=ocp.args.JsonRestore()))
    except Exception as e:  # orbax raises many types for one condition: unreadable data
      path = os.path.join(self.directory, str(step))
      raise CheckpointError(
          f"checkpoint {path} is unreadable or does not match this run "
          f"({type(e).__name__}: {str(e).splitlines()[0][:200]}); delete {path} to fall back "
          "to the previous checkpoint (or the whole folder to restart the stage)") from e
    return restored.state, dict(restored.meta)

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def restore_single_device(directory: str, target=None, *, step: int | None = None,
                          device: jax.Device | None = None):
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


def restore_params_single_device(path: str, *, step: int | None = None,
                                 device: jax.Device | None = None) -> dict:
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
