"""The teacher's config checks (``config.rl.teacher``): every setting that cannot work becomes
one ConfigError naming the key and the fix."""

import jax

from posttrain_jax import envs, models, objectives
from posttrain_jax.envs import contexts as contexts_lib
from posttrain_jax.methods.teacher.forward import SOURCES, TEACHER_FIELDS, own_copy
from posttrain_jax.objectives import refresh_rules
from posttrain_jax.registry import ConfigError
from posttrain_jax.train import inputs as inputs_lib
from posttrain_jax.train import placement as placement_lib
from posttrain_jax.train.teacher_model import STAGE, pretrain_context


def _require(cond: bool, msg: str) -> None:
  if not cond:
    raise ConfigError(msg)


def reads_teacher(cfg) -> bool:
  """Whether a selected piece reads the teacher (an advantage, the loss term, a rule)."""
  needs = inputs_lib.required(cfg)
  return bool(set(TEACHER_FIELDS) & (needs.update | needs.advantage))


def check(config) -> None:
  """ConfigError for a teacher setting that cannot work, naming the key and the fix."""
  cfg, t = config.rl, config.rl.teacher
  key = "config.rl.teacher"
  _require(
    t.source in SOURCES,
    f"{key}.source={t.source!r} is unknown; valid sources: {', '.join(SOURCES)}",
  )
  stages = tuple(config.stages)
  if t.source == "stage":
    _require(
      STAGE in stages,
      f"{key}.source='stage' reads the final parameters of the "
      f"'{STAGE}' stage; add '{STAGE}' to config.stages (after "
      "'pretrain')",
    )
    _require(
      not t.preset or t.preset in models.PRESETS,
      f"{key}.preset={t.preset!r} is unknown; valid presets: "
      f"{', '.join(models.PRESETS)} ('' for the student's)",
    )
  else:
    _require(
      STAGE not in stages,
      f"config.stages has '{STAGE}', which trains a teacher only "
      f"{key}.source='stage' reads; remove it or set the source",
    )
  if t.source == "path":
    _require(
      bool(t.path),
      f"{key}.source='path' needs {key}.path (a run's STAGE/final folder or a Hugging Face folder)",
    )
  refresh_rules.check_setting("config.rl.teacher.rule", t.rule, dict(t.rule_kwargs))
  _require(
    t.rule == "never" or t.source == "start",
    f"{key}.rule={t.rule!r} refreshes a copy of the policy; it needs {key}.source="
    f"'start' (the copy starts as the RL start), not {t.source!r}",
  )
  _require(not (cfg.lora and cfg.lora.rank and own_copy(cfg)), refresh_rules.LORA_MESSAGE)
  _require(
    t.context in contexts_lib.CONTEXTS,
    f"{key}.context={t.context!r} is unknown; valid contexts: "
    f"{', '.join(sorted(contexts_lib.CONTEXTS))}",
  )
  if t.context != "none":
    contexts_lib.check_context(
      envs.get_env(config.env.name), config.env.level, t.context, **dict(t.context_kwargs)
    )
    replay = cfg.scheduler.name not in ("none", "uniform")
    _require(
      not replay,
      f"{key}.context builds the teacher's prompt from each fresh row's "
      f"problem; config.rl.scheduler.name={cfg.scheduler.name!r} lays out "
      "or replays rows without them; use scheduler 'none' or no context",
    )
    _require(
      not config.env.dataset,
      f"{key}.context needs the env's problems (answers, "
      "feedback); unset config.env.dataset or the context",
    )
  if t.pretrain_context:
    name, kwargs = pretrain_context(t)
    _require(
      name != "none",
      f"{key}.pretrain_context={t.pretrain_context} shows the "
      f"teacher's context in pretraining; it needs a {key}.context (or "
      f"{key}.pretrain_context_name)",
    )
    _require(
      name in contexts_lib.CONTEXTS,
      f"{key}.pretrain_context_name={name!r} is unknown; valid contexts: "
      f"{', '.join(sorted(contexts_lib.CONTEXTS))}",
    )
    contexts_lib.check_context(envs.get_env(config.env.name), config.env.level, name, **kwargs)
  if tuple(t.mesh.shape):
    _require(
      t.source in ("stage", "path"),
      f"{key}.mesh places a teacher of fixed parameters on a mesh of its own; it needs "
      f"{key}.source 'stage' or 'path', not {t.source!r} (a copy of the policy lives "
      "on the trainer's mesh)",
    )
    _require(jax.process_count() == 1, f"{key}.mesh works in one process only for now")
    placement_lib.mesh_from_config(t.mesh, None, f"{key}.mesh")  # the shape fits the devices
  if float(t.lmbda) < 1.0:  # GKD's off-policy steps (methods/gkd/)
    _require(
      bool(t.loss) and not t.pg_during,
      f"{key}.lmbda={t.lmbda} < 1 distils on reference answers in some steps of the "
      f"distillation phase; it needs {key}.loss and {key}.pg_during=False (no policy "
      "gradient on answers the policy did not sample)",
    )
    _require(
      cfg.scheduler.name in ("none", "uniform")
      and not cfg.dynamic_sampling.enabled
      and not cfg.async_rollouts.enabled
      and not cfg.routing_replay,
      f"{key}.lmbda < 1 replaces a step's completions after sampling; it needs the "
      "synchronous loop without a replay scheduler, dynamic sampling or routing replay",
    )
  if t.loss:
    _require(
      t.loss in objectives.DIVERGENCES,
      f"{key}.loss={t.loss!r} is unknown; valid losses: "
      f"{', '.join(sorted(objectives.DIVERGENCES))} ('' for none)",
    )
  _require(
    t.source != "policy"
    or t.context != "none"
    or float(t.temperature) != float(cfg.temperature)
    or not reads_teacher(cfg),
    f"{key}.source='policy' without a context or another temperature is the student "
    "itself: the distillation signal is 0; set a context, a temperature or a source",
  )
