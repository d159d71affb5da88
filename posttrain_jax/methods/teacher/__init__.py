"""The teacher of on-policy distillation (``config.rl.teacher``; docs/teachers.md): its sources
(the RL start, the live policy, this run's ``teacher`` stage, another run or a Hugging Face
folder), its privileged context, the distillation phase and the refresh rules of its copy
(``every``, ``ema``, CGTR's gate; ``objectives/refresh_rules.py``).

Its ``METHODS`` entry: the teacher object (``build``), the copy and its rule's state
(``init_state``), the batch fields ``teacher_forward`` / ``teacher_logprobs`` /
``teacher_logits`` (the reference's log-probs when the teacher is the reference), the phase's
loss weights (``before_update``), the copy's refresh (``after_update``) and the policy's
accuracy with the teacher's context during RL (``rl_evaluator``). The teacher's model outside
RL (its stage, loading, its mesh) is the engine's ``train/teacher_model.py``.
"""

import jax
import jax.numpy as jnp

from posttrain_jax import fields as fields_lib
from posttrain_jax.methods.teacher import checks, forward
from posttrain_jax.methods.teacher.checks import check, reads_teacher
from posttrain_jax.methods.teacher.fields import TEACHER
from posttrain_jax.methods.teacher.forward import (
  SOURCES,
  TEACHER_FIELDS,
  Teacher,
  build,
  context_evaluator,
  is_reference,
  loss_fn,
  own_copy,
  phase_controls,
  refresh,
  teacher_inputs,
)
from posttrain_jax.objectives import refresh_rules
from posttrain_jax.registry import ConfigError
from posttrain_jax.train import hooks, rl


def _reads(config) -> bool:
  """Whether a selected piece reads the teacher's fields (False for a config whose pieces do
  not exist: the validator names those first)."""
  try:
    return reads_teacher(config.rl)
  except ConfigError:
    return False


def _active(config) -> bool:
  """A piece reads the teacher, or the config sets anything of ``rl.teacher`` (its checks then
  run) or trains a teacher stage."""
  t = config.rl.teacher.to_dict()
  return (
    _reads(config)
    or t != fields_lib.to_config(TEACHER).to_dict()
    or "teacher" in tuple(config.stages)
  )


def _build(ctx, init_params):
  del init_params
  if not _reads(ctx.config):
    return None
  return build(ctx, ctx.config.rl, rl.prefix_group(ctx))


def _init_state(ctx, built, init_params):
  """A copy of the RL start refreshed by the teacher's rule, and the rule's state (kept in the
  checkpoint meta)."""
  del built
  cfg = ctx.config.rl
  if not own_copy(cfg):
    return {}
  return {
    "teacher": jax.tree.map(jnp.copy, ctx.placement.place(init_params)),
    "teacher_rule": refresh_rules.init_state(cfg.teacher.rule, **dict(cfg.teacher.rule_kwargs)),
  }


def _before_update(ctx, run, built, controls, batch, step, scratch):
  del run, built, batch
  controls = phase_controls(ctx.config.rl, controls, step)
  if ctx.config.rl.teacher.loss:
    scratch["teacher_phase"] = (controls["distill_coef"], controls["pg_coef"])
  return controls


def _after_update(ctx, run, built, state, record, step, scratch):
  """The phase's loss weights this update used, then the copy's refresh from the updated
  policy."""
  del built
  metrics = {}
  if "teacher_phase" in scratch:
    distill, pg = scratch["teacher_phase"]
    metrics = {"control/distill_coef": float(distill), "control/pg_coef": float(pg)}
  if "teacher" in state:
    state, refreshed = refresh(
      ctx.config.rl, state, run.fns.full(state["policy"].params), {**record, **metrics}, step
    )
    metrics.update(refreshed)
  return state, metrics


def _rl_evaluator(ctx, built, evaluator):
  return context_evaluator(ctx, built, evaluator)


def _loss_settings(config) -> dict:
  """The distillation term (``LOSS_TERMS['distill']``) and its arguments."""
  t = config.rl.teacher
  return {"distill": t.loss, "distill_kwargs": tuple(sorted(dict(t.loss_kwargs).items()))}


def _reads_reference(config) -> bool:
  """The teacher is the reference and a piece reads it: the reference's forward runs."""
  return is_reference(config.rl) and _reads(config)


def _reads_start(config) -> bool:
  """A 'start' teacher without a refresh runs on the frozen RL start."""
  t = config.rl.teacher
  return t.source == "start" and t.rule == "never" and _reads(config)


METHOD = hooks.Method(
  name="teacher",
  section="rl.teacher",
  active=_active,
  doc="docs/teachers.md",
  check=check,
  build=_build,
  init_state=_init_state,
  host_state=("teacher_rule",),
  producers=forward.PRODUCERS,
  stages=("teacher",),
  before_update=_before_update,
  after_update=_after_update,
  rl_evaluator=_rl_evaluator,
  reads_reference=_reads_reference,
  reads_start=_reads_start,
  loss_settings=_loss_settings,
  fields={"rl.teacher": TEACHER},
)

__all__ = [
  "METHOD",
  "SOURCES",
  "TEACHER_FIELDS",
  "Teacher",
  "build",
  "check",
  "checks",
  "context_evaluator",
  "forward",
  "is_reference",
  "loss_fn",
  "own_copy",
  "phase_controls",
  "reads_teacher",
  "refresh",
  "teacher_inputs",
]
