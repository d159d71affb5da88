"""A teacher's model, as the engine knows it: the ``teacher`` stage (a model of
``config.rl.teacher.preset`` pretrained in this run), a teacher loaded from another run or a
Hugging Face folder, its own mesh, and the prompt length its privileged context needs. The
teacher of on-policy distillation itself (its forward, refresh, phases, checks) is the method in
``posttrain_jax/methods/teacher/``; docs/teachers.md."""

import dataclasses
import json
import os

import ml_collections
from flax import nnx

from posttrain_jax import io as ptio
from posttrain_jax import models, rollout
from posttrain_jax.envs import contexts as contexts_lib
from posttrain_jax.registry import ConfigError
from posttrain_jax.train import placement as placement_lib
from posttrain_jax.train import state as state_lib

STAGE = "teacher"  # the stage that trains a teacher of its own (source 'stage')


def model_section(config) -> ml_collections.ConfigDict:
  """``config.model`` with the teacher's preset and overrides (source 'stage')."""
  section = ml_collections.ConfigDict(config.model.to_dict())
  t = config.rl.teacher
  if t.preset:
    section.preset = t.preset
  if t.overrides:
    section.overrides = ml_collections.ConfigDict(
      {**section.overrides.to_dict(), **t.overrides.to_dict()}
    )
  return section


def check_vocabulary(student_tokenizer, teacher_tokenizer, where: str) -> None:
  """ConfigError unless the teacher's tokenizer maps every token as the student's does."""
  a, b = student_tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
  if a == b:
    return
  diff = sorted(set(a.items()) ^ set(b.items()), key=lambda kv: kv[1])[:3]
  raise ConfigError(
    f"the teacher at {where} has a vocabulary of {len(b)} tokens that differs from the "
    f"student's {len(a)} (e.g. {diff}); a teacher scores the student's tokens, so it must "
    "share the student's tokenizer (train it in this run with config.rl.teacher.source="
    "'stage', or pick a checkpoint made with the same tokenizer)"
  )


def load_path(path: str, tokenizer, placement):
  """``(graphdef, params)`` of the teacher at ``path``: a Hugging Face folder (config.json and
  safetensors) or a run's ``STAGE/final`` folder (its run's config.json names the model)."""
  path = os.path.abspath(os.path.expanduser(path))
  if not os.path.isdir(path):
    raise ConfigError(
      f"config.rl.teacher.path={path!r} is not a folder; give a run's "
      "STAGE/final folder or a Hugging Face folder"
    )
  if os.path.exists(os.path.join(path, "config.json")):  # a Hugging Face folder
    check_vocabulary(tokenizer, models.load_hf_tokenizer(path), path)
    model, _ = models.hf.load_pretrained(path, mesh=placement.mesh, rules="trainer")
    return nnx.split(model)
  run_dir = os.path.dirname(os.path.dirname(path))
  config_path = os.path.join(run_dir, "config.json")
  if not os.path.exists(config_path):
    raise ConfigError(
      f"config.rl.teacher.path={path!r} is neither a Hugging Face folder "
      f"(no config.json in it) nor a run's STAGE/final folder (no {config_path})"
    )
  with open(config_path, encoding="utf-8") as f:
    run_config = ml_collections.ConfigDict(json.load(f))
  model_cfg = run_config.model
  if os.path.basename(os.path.dirname(path)) == STAGE:  # that run's own teacher
    model_cfg = model_section(run_config)
  if model_cfg.get("hf_path", ""):
    check_vocabulary(tokenizer, models.load_hf_tokenizer(model_cfg.hf_path), path)
  else:
    check_vocabulary(tokenizer, models.load_tokenizer(os.path.join(run_dir, "tokenizer")), path)
  graphdef, target = state_lib.build_model(model_cfg, len(tokenizer), 0)
  return graphdef, restore_final(path, target, placement)


def restore_final(path: str, target, placement):
  """Parameters of a ``final`` folder, placed on the run's mesh."""
  ckpt = ptio.Checkpointer(path, max_to_keep=1)
  try:
    params, _ = ckpt.restore(target)
  finally:
    ckpt.close()
  return placement.place(params)


def teacher_placement(config):
  """The teacher's own :class:`~posttrain_jax.train.placement.Placement`
  (``config.rl.teacher.mesh``), or None when its shape is empty: the run's mesh."""
  section = config.rl.teacher.get("mesh", None)
  if section is None or not tuple(section.get("shape", ()) or ()):
    return None
  return placement_lib.Placement(
    placement_lib.mesh_from_config(section, None, "config.rl.teacher.mesh")
  )


def stage_model(ctx):
  """``(graphdef, fresh params)`` of the ``teacher`` stage's model (``model_section``)."""
  seed = ctx.config.seed + 1000  # not the student's initialisation
  graphdef, params = state_lib.build_model(model_section(ctx.config), len(ctx.tokenizer), seed)
  return graphdef, ctx.placement.place(params)


def stage_context(ctx):
  """``ctx`` with the ``teacher`` stage's model (fresh parameters) in place of the student's:
  ``pretrain.run(stage_context(ctx), stage=STAGE, **pretrain_overrides(config))`` trains it."""
  graphdef, params = stage_model(ctx)
  return dataclasses.replace(ctx, graphdef=graphdef, init_params=params)


def pretrain_overrides(config) -> dict:
  """The ``teacher`` stage's ``config.pretrain`` overrides: ``teacher.pretrain_steps`` steps
  (0: ``config.pretrain.steps``) on a corpus with ``teacher.pretrain_noise``."""
  t = config.rl.teacher
  return {
    "steps": int(t.pretrain_steps or config.pretrain.steps),
    "corpus_noise": float(t.pretrain_noise),
  }


def pretrain_context(t) -> tuple[str, dict]:
  """``(name, kwargs)`` of the context pretraining shows (``pretrain_context_name``, default
  the teacher's ``context``; ``pretrain_context_kwargs``, default the teacher's kwargs when the
  name is the teacher's context)."""
  name = t.get("pretrain_context_name", "") or t.context
  kwargs = dict(t.pretrain_context_kwargs or (t.context_kwargs if name == t.context else {}))
  return name, kwargs


def context_prompt_len(ctx, cfg, *, pretraining: bool = False) -> int:
  """``S_T``: the student's prompt length plus the longest context, bucketed (``pretraining``:
  the context pretraining shows, :func:`pretrain_context`)."""
  t = cfg.teacher
  name, kwargs = pretrain_context(t) if pretraining else (t.context, dict(t.context_kwargs))
  if name == "none":
    return ctx.prompt_len
  extra = contexts_lib.max_context_chars(ctx.env, ctx.config.env.level, name, **kwargs)
  return rollout.bucket_length(ctx.prompt_len + extra)
