"""The RL run's prompt scheduler (``config.rl.scheduler``): construction, static row counts and
checkpointed state (host-side; :mod:`posttrain_jax.scheduling` holds the schedulers).

Row counts are static per run: ``gen_rows`` generation rows per step (``P * G``; CERO's padded
layout ``P * g_max``) and ``train_rows = gen_rows + M`` rows per update (``M`` replayed rows of a
replay scheduler, padding with ``valid = 0`` while its buffer is short), so no step recompiles.

State: the scheduler's JSON meta goes into the RL checkpoint's meta (``"scheduler"``), its numpy
arrays into ``<rl>/scheduler/<step>.npz`` next to the orbax checkpoints (written by the primary
process before the orbax save, read by every process on resume).
"""

import glob
import os

import numpy as np

from posttrain_jax import scheduling

NONE = "none"
REPLAY = ("rollout_replay", "group_replay")


def make(cfg) -> scheduling.Scheduler:
  """The scheduler of ``config.rl`` (``scheduler.name`` with ``scheduler.kwargs``)."""
  section = cfg.get("scheduler", None)
  name = section.name if section is not None else NONE
  kwargs = section.kwargs.to_dict() if section is not None else {}
  return scheduling.make(name, group_size=cfg.group_size, **kwargs)


def name_of(cfg) -> str:
  section = cfg.get("scheduler", None)
  return section.name if section is not None else NONE


def gen_rows(scheduler, prompts: int) -> int:
  """Generation rows per step: ``P * g_max`` for CERO's padded layout, else ``P * G``."""
  if isinstance(scheduler, scheduling.Cero) and scheduler.layout == "padded":
    return prompts * int(scheduler.state["config"]["g_max"])
  return prompts * scheduler.group_size


def replay_rows(scheduler, prompts: int) -> int:
  """``M``: replayed rows appended to every update's batch (0 unless a replay scheduler)."""
  if isinstance(scheduler, scheduling.Replay):
    return scheduler.buffer.replay_rows(gen_rows(scheduler, prompts))
  return 0


def _flatten(tree, prefix="") -> dict:
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f"{prefix}{k}/"))
    else:
      out[f"{prefix}{k}"] = np.asarray(v)
  return out


def _unflatten(flat) -> dict:
  out = {}
  for key, v in flat.items():
    *path, leaf = key.split("/")
    node = out
    for p in path:
      node = node.setdefault(p, {})
    node[leaf] = v
  return out


def _path(out_dir: str, step: int) -> str:
  return os.path.join(out_dir, "scheduler", f"{step}.npz")


def save(scheduler, out_dir: str, step: int, *, write: bool = True, keep: int = 3) -> dict:
  """Writes the scheduler's arrays for ``step`` (``write``: the primary process) and returns
  the JSON part for the checkpoint meta. Keeps the newest ``keep`` array files."""
  st = scheduler.state_dict()
  flat = _flatten(st.get("arrays", {}))
  if write:
    path = _path(out_dir, step)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp.npz"
    np.savez(tmp, **flat)
    os.replace(tmp, path)
    files = sorted(
      glob.glob(os.path.join(out_dir, "scheduler", "*.npz")),
      key=lambda p: (
        int(os.path.basename(p).split(".")[0])
        if os.path.basename(p).split(".")[0].isdigit()
        else -1
      ),
    )
    for old in files[:-keep]:
      os.remove(old)
  return {"meta": st["meta"], "arrays": bool(flat)}


def load(scheduler, out_dir: str, step: int, saved: dict) -> None:
  """Restores the state :func:`save` wrote for ``step`` (``saved``: its checkpoint meta)."""
  arrays = {}
  if saved.get("arrays"):
    with np.load(_path(out_dir, step)) as f:
      arrays = _unflatten({k: f[k] for k in f.files})
  scheduler.load_state_dict({"meta": saved["meta"], "arrays": arrays})
