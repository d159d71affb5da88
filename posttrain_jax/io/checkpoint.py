"""Orbax checkpoints of everything a run needs to resume.

A checkpoint holds a pytree ``state`` (parameters, optimiser state, step, keys, controller
states) and a JSON ``meta`` dict (host-side state: counters, trackers, config echo). Saves are
atomic: orbax writes to a temporary folder and renames it on commit, so a run killed mid-save
never leaves a half-written checkpoint as the latest one.
"""

import os

import jax
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
  """A checkpoint is missing, unreadable, or does not match the run restoring it."""


class Checkpointer:
  """Keeps the last ``max_to_keep`` checkpoints of one stage under ``directory``."""

  def __init__(self, directory: str, *, max_to_keep: int = 2, async_save: bool = False):
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                           enable_async_checkpointing=async_save)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_names=("state", "meta"))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state, meta: dict | None = None, *, force: bool = True) -> None:
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta or {})), force=force)

  def restore(self, target, step: int | None = None):
    """Restores ``(state, meta)`` at ``step`` (default latest) with the structure of ``target``.

    ``target`` is a pytree of arrays or ``jax.ShapeDtypeStruct`` (with shardings, to restore onto
    a mesh). Raises CheckpointError naming the folder and the fix when it cannot be read.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"no checkpoint in {self.directory}; run the stage that writes it "
                            "first, or point --workdir at a run that has one")
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
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
