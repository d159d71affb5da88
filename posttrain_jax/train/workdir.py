"""One run per workdir, and a workdir that remembers the config its results were made with.

* :func:`lock`: an exclusive ``fcntl.flock`` on ``WORKDIR/.lock``, held for the whole run by
  process 0. The kernel releases it when the process exits, however it exits (kill -9
  included), so a lock file left behind never blocks; the file records the holder's pid, host
  and start time for the refusal message.
* :func:`reconcile`: ``WORKDIR/config.json`` is written by the first run and compared with every
  later run's config. A difference in a key that changes results, where a stage that key
  affects has already produced output, is refused with one line naming the keys; with
  ``rerun=True`` the affected stages' outputs are moved aside to ``WORKDIR/replaced/<time>/``
  (never deleted) and run again. Stages are compared by name (train/stages.py): a key affects
  the first stage of the run whose kind reads it (declared with the key), a change in
  ``stage_specs.NAME`` the stage NAME, and each stage is rerun with every stage after it
  (each key's first stage and whether it reruns anything are declared beside its default,
  train/config_fields/).
  ``WORKDIR/stages.json`` records, per started stage, the stages that ran before it in its run
  (``config.stages``), so that running a subset of the stages is not a different config, but
  a stage whose inputs would change is.
"""

import contextlib
import fcntl
import json
import os
import shutil
import socket
import sys
import time

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from posttrain_jax import fields, parallel
from posttrain_jax.registry import ConfigError
from posttrain_jax.train import config_fields, configs
from posttrain_jax.train import stages as stages_lib

LOCK_FILE = ".lock"
CONFIG_FILE = "config.json"
STAGES_FILE = "stages.json"
REPLACED_DIR = "replaced"

# Keys an experiment file adds beside the declared ones that change no result: a sweep's
# description and notes, a study's search settings (sweeps/hpo.py). Every declared key says itself whether a change reruns anything and
# the first kind of stage it reruns (train/config_fields/: ``Field.rerun`` and ``stage``): a
# change to a key with ``rerun=False`` (display, caches, placement, checkpoint frequency, stop
# rules, the reward worker count) reruns nothing, and ``stages`` is compared per stage
# through stages.json (:func:`_stage_differences`).
NOT_DECLARED = ("sweep", "hpo", "notes", "description")


def _declared(key: str, keys: dict | None = None):
  """The declaration of ``key`` or of the free-form section it lies in (``rl.advantage_kwargs``
  for ``rl.advantage_kwargs.eps``) among ``keys`` (``fields.flatten`` of the config's
  declaration; default the engine's); None for a key declared nowhere."""
  keys = config_fields.KEYS if keys is None else keys
  parts = key.split(".")
  for n in range(len(parts), 0, -1):
    found = keys.get(".".join(parts[:n]))
    if found is not None:
      return found
  return None


# -- the lock -------------------------------------------------------------------------------------
@contextlib.contextmanager
def lock(workdir: str):
  """Holds the workdir's exclusive lock (taken by process 0; every process raises ConfigError,
  naming the run that holds it, when process 0 cannot take it). Creates ``workdir``."""
  handle, error = None, ""
  if parallel.is_primary():
    try:
      handle = _acquire(workdir)
    except ConfigError as e:
      error = str(e)
  if _on_process_0(bool(error)):
    raise ConfigError(error or f"process 0 could not lock workdir {workdir}; see its error")
  try:
    yield
  finally:
    if handle is not None:
      fcntl.flock(handle, fcntl.LOCK_UN)
      handle.close()


def _on_process_0(flag: bool) -> bool:
  """Process 0's ``flag``, on every process."""
  if jax.process_count() == 1:
    return flag
  return bool(multihost_utils.broadcast_one_to_all(np.asarray(flag)))


def _acquire(workdir: str):
  try:
    os.makedirs(workdir, exist_ok=True)
    handle = open(os.path.join(workdir, LOCK_FILE), "a+", encoding="utf-8")
  except OSError as e:
    raise ConfigError(
      f"workdir {workdir} is not writable ({e.strerror}); pass a --workdir you can write to"
    ) from None
  try:
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    handle.seek(0)
    holder = handle.read().strip()
    handle.close()
    raise ConfigError(
      f"workdir {workdir} is in use by another run ({holder or 'pid unknown'});"
      " wait for it or pass another --workdir"
    ) from None
  handle.seek(0)
  handle.truncate()
  handle.write(
    f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}"
  )
  handle.flush()
  return handle


# -- the stored config ----------------------------------------------------------------------------
def reconcile(
  workdir: str, config: ml_collections.ConfigDict, *, rerun: bool = False, root=None
) -> None:
  """Checks ``config`` (validated, complete) against the one ``workdir`` was made with; raises
  ConfigError when they differ in a key that changes the results of a stage that already ran
  (unless ``rerun``: then those stages' outputs are moved aside). Writes config.json on the
  first run and stages.json. ``root``: the config's declaration (``hooks.config_root(methods)``;
  default the engine's sections). Every process checks; process 0 writes."""
  cmp = _compare(workdir, config, root)
  diffs, kinds, names = cmp["diffs"], cmp["kinds"], list(config.stages)
  direct = {s for _, s in diffs if s is not None}
  first = min((names.index(s) for s in direct if s in names), default=len(names))
  # This run's stages from the first affected one on; a stage of the workdir this run does not
  # list, when a change names it or it ran after an affected stage (stages.json).
  affected = [s for s in names[first:] if started(workdir, s, kinds[s])]
  others = [s for s in cmp["order"] if s not in names and started(workdir, s, kinds[s])]
  grew = True
  while grew:
    grew = False
    for s in others:
      after = cmp["recorded"].get(s, [])
      if s not in affected and (s in direct or any(i in affected for i in after)):
        affected.append(s)
        grew = True
  if first == 0 and os.path.lexists(os.path.join(workdir, "tokenizer")) and not affected:
    affected = names[:1]  # the tokenizer is made before the first stage starts
  # the stages named: those the run has or had (not every stage a config could list)
  named = ", ".join([s for s in names[first:]] + [s for s in affected if s not in names])
  if affected and not rerun:
    changes = ", ".join(text for text, _ in diffs)
    raise ConfigError(
      f"workdir {workdir} was made with a different config: {changes}; pass "
      f"--rerun to rerun the stages they affect ({named}),"
      " or use another --workdir"
    )
  parallel.barrier("workdir_check")  # every process read the old state
  if parallel.is_primary():
    if affected:
      entries = [n for s in affected for n in outputs(s, kinds[s])]
      moved = _move_aside(workdir, entries + (["tokenizer"] if first == 0 else []))
      print(
        f"[workdir] config changed ({', '.join(t for t, _ in diffs)}); rerunning "
        f"{named}; the old outputs are in {moved}",
        file=sys.stderr,
      )
    elif diffs:
      print(
        f"[workdir] config changed ({', '.join(t for t, _ in diffs)}) before any stage it "
        f"affects started; {CONFIG_FILE} updated",
        file=sys.stderr,
      )
    if diffs or not os.path.exists(os.path.join(workdir, CONFIG_FILE)):
      write_config(workdir, config)
    _record_stages(workdir, tuple(config.stages))
  parallel.barrier("workdir_ready")


def write_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Writes ``config`` as the workdir's config.json (atomically)."""
  path = os.path.join(workdir, CONFIG_FILE)
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    f.write(config.to_json_best_effort(indent=2))
  os.replace(path + ".tmp", path)


def differences(
  workdir: str, config: ml_collections.ConfigDict, root=None
) -> list[tuple[str, str]]:
  """``[(text, stage)]``: each result-affecting difference between the stored config and
  ``config`` ('rl.lr 0.001 -> 0.01'), with the first stage (by name) it affects (None: no
  stage of this run or of the workdir). [] for a new workdir."""
  return _compare(workdir, config, root)["diffs"]


def _read_stored(workdir: str) -> dict | None:
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path, encoding="utf-8") as f:
      stored = json.load(f)
    if not isinstance(stored, dict):
      raise ValueError(f"a JSON {type(stored).__name__}, not an object")
  except (OSError, ValueError) as e:
    raise ConfigError(
      f"{path} is unreadable ({e}); move it away (this run's config then becomes"
      " the workdir's), or use another --workdir"
    ) from None
  return stored


def _compare(workdir: str, config: ml_collections.ConfigDict, root=None) -> dict:
  """The differences (:func:`differences`), the stages in order (this run's, then the others the
  workdir holds) and each one's kind."""
  stored = _read_stored(workdir)
  new_json = json.loads(config.to_json_best_effort())
  names = list(config.stages)
  recorded = _recorded_inputs(workdir, stored) if stored is not None else {}
  old_names = list(recorded) + list((stored or {}).get("stages", ()))
  order = names + [n for n in dict.fromkeys(old_names) if n not in names]
  kinds = {n: _kind(n, new_json, stored or {}) for n in order}
  if stored is None:
    return dict(diffs=[], order=order, kinds=kinds, recorded=recorded)
  old, new = _flatten(stored), _flatten(new_json)
  base = _flatten(json.loads(configs.base_config(root).to_json_best_effort()))
  keys = config_fields.KEYS if root is None else fields.flatten(root)
  out = []
  for key in sorted(set(new) | {k for k in old if _free_form(k)}):
    if _ignored(key, keys):
      continue
    before = old.get(key, base.get(key, _UNSET))  # older config.json: defaults fill it
    after = new.get(key, _UNSET)
    if before != after:
      out.append(
        (f"{key} {_show(before)} -> {_show(after)}", _first_stage(key, order, kinds, keys))
      )
  diffs = out + _stage_differences(workdir, recorded, names, kinds)
  return dict(diffs=diffs, order=order, kinds=kinds, recorded=recorded)


def stage_settings(config: ml_collections.ConfigDict, name: str, root=None) -> dict:
  """The flat settings of ``config`` (``{'pretrain.lr': 0.003, ...}``) whose change makes
  :func:`reconcile` rerun stage ``name`` of ``config.stages``: those declared for its kind or an
  earlier one (what two configs must agree on to share that stage's workdir, e.g. a pretrained
  base). ``root`` as in :func:`reconcile`."""
  flat_json = json.loads(config.to_json_best_effort())
  order = list(config.stages)
  if name not in order:
    raise ValueError(f"stage {name!r} is not one of the config's stages {order}")
  kinds = {n: _kind(n, flat_json, {}) for n in order}
  keys = config_fields.KEYS if root is None else fields.flatten(root)
  out = {}
  for key, value in _flatten(flat_json).items():
    if _ignored(key, keys):
      continue
    first = _first_stage(key, order, kinds, keys)
    if first is not None and order.index(first) <= order.index(name):
      out[key] = value
  return out


def _kind(name: str, new: dict, stored: dict) -> str:
  """The kind of stage ``name``: from this config's spec, the stored one's, else the name
  (a name of no known kind counts as pretraining: every change affects it)."""
  for cfg in (new, stored):
    kind = ((cfg.get("stage_specs") or {}).get(name) or {}).get("kind")
    if kind in stages_lib.STAGES:
      return kind
  return name if name in stages_lib.STAGES else "pretrain"


_UNSET = object()


def _show(value) -> str:
  return "(unset)" if value is _UNSET else json.dumps(value)


def _flatten(tree, prefix: str = "") -> dict:
  """{'rl.lr': 0.001, ...}; lists and tuples are leaves."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict) and value:
      out.update(_flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def _matches(key: str, prefix: str) -> bool:
  return key == prefix or key.startswith(prefix + ".")


def _spec_key(key: str) -> tuple[str, str] | None:
  """``('rl_b', 'rl.lr')`` for ``stage_specs.rl_b.overrides.rl.lr`` (``(name, '')`` for
  another key of that spec); None for a key outside ``stage_specs``."""
  parts = key.split(".")
  if parts[0] != "stage_specs" or len(parts) < 2:
    return None
  rest = parts[3:] if len(parts) > 3 and parts[2] == "overrides" else []
  return parts[1], ".".join(rest)


def _ignored(key: str, keys: dict | None = None) -> bool:
  spec = _spec_key(key)
  if spec is not None:
    key = spec[1]
    if not key:
      return False
  if any(_matches(key, p) for p in NOT_DECLARED):
    return True
  declared = _declared(key, keys)
  return declared is not None and not declared.rerun


def _free_form(key: str) -> bool:
  """Inside a section of free-form keys (``*kwargs``, ``reward_shaping``, ``stage_specs``),
  where a stored key the new config lacks was removed, not retired by a newer version."""
  return any(part.endswith(configs._FREE_FORM) for part in key.split(".")[:-1])  # pylint: disable=protected-access


def _first_stage(key: str, order: list, kinds: dict, keys: dict | None = None) -> str | None:
  """The first stage of ``order`` that a change of ``key`` affects: for a key of
  ``stage_specs.NAME``, NAME; else the first of a kind at or after the key's
  (declared with it, ``Field.stage``). None when no stage of ``order`` is affected."""
  spec = _spec_key(key)
  if spec is not None:
    return spec[0] if spec[0] in order else None
  declared = _declared(key, keys)
  kind = declared.stage if declared is not None else "pretrain"  # unknown: the safe answer
  rank = list(stages_lib.STAGES).index(kind)
  later = [n for n in order if list(stages_lib.STAGES).index(kinds[n]) >= rank]
  return later[0] if later else None


# -- stages ---------------------------------------------------------------------------------------
def outputs(name: str, kind: str) -> tuple:
  """What stage ``name`` of ``kind`` leaves in the workdir: its folder and its kind's files
  (e.g. pretraining's tokenizer), moved aside together when it is rerun."""
  return (name,) + stages_lib.STAGES[kind].outputs


def started(workdir: str, name: str, kind: str | None = None) -> bool:
  """Whether stage ``name`` (of ``kind``; default the name) left any output in ``workdir``."""
  return any(os.path.lexists(os.path.join(workdir, n)) for n in outputs(name, kind or name))


def unused(workdir: str) -> bool:
  """Whether no run has written to ``workdir`` yet (nothing in it but the lock file)."""
  return not any(n != LOCK_FILE for n in os.listdir(workdir)) if os.path.isdir(workdir) else True


def forget(workdir: str) -> None:
  """Removes what a first run wrote before its stages started (config.json, stages.json, the
  tokenizer), so that a run refused there leaves an unused workdir (process 0)."""
  if parallel.is_primary():
    for name in (CONFIG_FILE, STAGES_FILE):
      if os.path.exists(os.path.join(workdir, name)):
        os.remove(os.path.join(workdir, name))
    shutil.rmtree(os.path.join(workdir, "tokenizer"), ignore_errors=True)
  parallel.barrier("workdir_forget")


def _inputs(stage: str, stages) -> list[str]:
  """The stages a run of ``stages`` runs before ``stage`` (whose results it starts from)."""
  stages = list(stages)
  return stages[: stages.index(stage)]


def _recorded_inputs(workdir: str, stored: dict) -> dict:
  """stages.json, or for a workdir older than it, the inputs its config.json's stages imply."""
  path = os.path.join(workdir, STAGES_FILE)
  try:
    with open(path, encoding="utf-8") as f:
      recorded = json.load(f)
    if not isinstance(recorded, dict):
      raise ValueError(f"a JSON {type(recorded).__name__}, not an object")
    return recorded
  except FileNotFoundError:
    stages = stored.get("stages", ())
    return {s: _inputs(s, stages) for s in stages}
  except (OSError, ValueError) as e:
    raise ConfigError(
      f"{path} is unreadable ({e}); move it away (the stages then count as run in this "
      "config's order), or use another --workdir"
    ) from None


def _stage_differences(workdir: str, recorded: dict, stages, kinds: dict) -> list[tuple[str, str]]:
  """The first started stage this run would skip or resume after other stages than it ran
  after (every later stage is rerun with it, so it alone is named)."""
  for stage in stages:
    if (
      stage in recorded
      and started(workdir, stage, kinds[stage])
      and recorded[stage] != _inputs(stage, stages)
    ):
      return [
        (
          f"stages: {stage} ran after {_names(recorded[stage])}, this run puts it after "
          f"{_names(_inputs(stage, stages))}",
          stage,
        )
      ]
  return []


def _names(stages) -> str:
  return f"({', '.join(stages)})" if stages else "no stage"


def _record_stages(workdir: str, stages) -> None:
  path = os.path.join(workdir, STAGES_FILE)
  recorded = {}
  if os.path.exists(path):
    recorded = _recorded_inputs(workdir, {})
  recorded.update({s: _inputs(s, stages) for s in stages})
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(recorded, f, indent=2, sort_keys=True)
  os.replace(path + ".tmp", path)


def _move_aside(workdir: str, names) -> str:
  """Moves the workdir entries ``names`` and the old config.json to WORKDIR/replaced/<time>/."""
  stamp = time.strftime("%Y%m%d-%H%M%S")
  dest = os.path.join(workdir, REPLACED_DIR, stamp)
  n = 1
  while os.path.lexists(dest):
    dest = os.path.join(workdir, REPLACED_DIR, f"{stamp}-{n}")
    n += 1
  os.makedirs(dest)
  for name in list(dict.fromkeys(names)) + [CONFIG_FILE]:
    if os.path.lexists(os.path.join(workdir, name)):
      os.rename(os.path.join(workdir, name), os.path.join(dest, name))
  return dest
