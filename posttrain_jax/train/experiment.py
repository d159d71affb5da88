"""Runs an experiment config's stages (train/stages.py) in a locked workdir; a rerun skips finished
stages and resumes others."""

import json
import os
import sys
import tempfile

import jax
import ml_collections
from flax import nnx

from posttrain_jax import io as ptio
from posttrain_jax import models, parallel
from posttrain_jax.parallel import compile_cache
from posttrain_jax.registry import StagePaused
from posttrain_jax.train import context as context_lib
from posttrain_jax.train import hooks
from posttrain_jax.train import stages as stages_lib
from posttrain_jax.train import state as state_lib
from posttrain_jax.train import validate as validate_lib
from posttrain_jax.train import workdir as workdir_lib

ConfigError = validate_lib.ConfigError
PAUSED_FILE = "paused.json"  # a run paused by config.rl.pause_after: {paused_stage, paused_step}


def workdir_path(workdir: str | None) -> str:
  """``workdir`` as an absolute path, or ConfigError when none was given."""
  if not workdir:
    raise ConfigError("no --workdir given; pass --workdir=DIR (e.g. runs/quickstart)")
  return os.path.abspath(workdir)


def prepare_workdir(workdir: str | None) -> str:
  """Creates ``workdir`` and proves it is writable, or raises ConfigError saying so."""
  workdir = workdir_path(workdir)
  try:
    os.makedirs(workdir, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=workdir):
      pass
  except OSError as e:
    raise ConfigError(
      f"workdir {workdir} is not writable ({e.strerror}); pass a --workdir you can write to"
    ) from None
  return workdir


def load_final(workdir: str, stage: str):
  """``(params, ModelConfig, tokenizer)`` of a finished ``stage`` of the run in ``workdir``: its
  final parameters, and the run's tokenizer (or, for a run started from a Hugging Face folder,
  that folder's). Raises FileNotFoundError when the stage has no final parameters."""
  path = os.path.join(workdir, stage, "final")
  if not os.path.isdir(path):
    raise FileNotFoundError(
      f"run {workdir} has no final parameters for stage {stage!r} ({path} is missing)"
    )
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    model_cfg = ml_collections.ConfigDict(json.load(f)["model"])
  hf_path = model_cfg.get("hf_path", "") or ""
  tokenizer = (
    models.load_hf_tokenizer(hf_path)
    if hf_path
    else models.load_tokenizer(os.path.join(workdir, "tokenizer"))
  )
  graphdef, target = state_lib.build_model(model_cfg, len(tokenizer), 0)
  ckpt = ptio.Checkpointer(path, max_to_keep=1)
  try:
    params, _ = ckpt.restore(target)
  finally:
    ckpt.close()
  return params, nnx.merge(graphdef, target).config, tokenizer


def run(
  config,
  workdir: str | None,
  *,
  methods: tuple,
  rerun: bool = False,
  fallback_checkpoint: bool = False,
) -> dict:
  """Validates ``config``, then runs its stages under ``workdir``, holding the workdir's lock
  (train/workdir.py). A workdir made with a config that differs in a key that changes results
  is refused (ConfigError), unless ``rerun``: then the stages it affects run again.
  ``fallback_checkpoint``: a checkpoint (or a stage's final parameters) that fails its checksum
  or cannot be read is set aside (renamed ``*.corrupt``) and the run continues from the
  previous one, instead of stopping with a CheckpointError. ``methods``: the METHODS table
  (``posttrain_jax.methods``; ``posttrain_jax.methods.run`` passes it). Returns the eval
  summary."""
  validate_lib.validate(config, methods=methods)
  context_lib.apply_cpu_devices(config)  # before anything starts JAX's backend
  try:  # before the first compilation
    compile_cache.enable(config.compilation_cache_dir)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  workdir = workdir_path(workdir)
  with workdir_lib.lock(workdir):  # before anything is written
    prepare_workdir(workdir)
    fresh = workdir_lib.unused(workdir)
    workdir_lib.reconcile(workdir, config, rerun=rerun, root=hooks.config_root(methods))
    try:  # builds the tokenizer and checks what needs it (sequence lengths, vocabulary fit)
      plan = stages_lib.plan(config)
      ctx = context_lib.make_context(
        config, workdir, methods=methods, stage_configs=[s.config for s in plan]
      )
    except Exception:
      if fresh:  # a refused first run leaves the workdir as it found it
        workdir_lib.forget(workdir)
      raise
    ctx.fallback_checkpoint = fallback_checkpoint
    try:
      summary = stages_lib.run_plan(ctx)
    except StagePaused as p:  # config.rl.pause_after: checkpointed on purpose, not finished
      summary = {"paused_stage": p.stage, "paused_step": p.step}
      if parallel.is_primary():
        with open(os.path.join(workdir, PAUSED_FILE), "w", encoding="utf-8") as f:
          json.dump(summary, f)
      print(
        f"{p}; run again with a larger config.rl.pause_after (or 0) to continue", file=sys.stderr
      )
    else:
      if parallel.is_primary() and os.path.exists(os.path.join(workdir, PAUSED_FILE)):
        os.remove(os.path.join(workdir, PAUSED_FILE))  # continued to the end
  jax.effects_barrier()
  return summary
