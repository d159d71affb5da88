"""The teacher of on-policy distillation (``config.rl.teacher``; docs/teachers.md).

One concept with several sources (``teacher.source``):

- ``start``: the RL start's parameters, i.e. the reference. With a refresh rule
  (``teacher.rule``, :data:`~posttrain_jax.train.teacher_rules.TEACHER_RULES`: ``every``,
  ``ema``, ``cgtr``) it is a copy of them, refreshed from the policy after the update: a frozen
  snapshot refreshed every M steps, an EMA of the policy, or CGTR's consolidation gate. The
  copy is checkpointed with the run state and bit-identical between refreshes.
- ``policy``: the live policy under stop-gradient (self-distillation; with a privileged
  context, OPSD).
- ``stage``: the final parameters of this run's ``teacher`` stage: a model of preset
  ``teacher.preset`` (+ ``overrides``) pretrained on the task like the student (a larger or
  better teacher), sharing the student's tokenizer.
- ``path``: a finished stage's ``final`` folder of another run (``RUN/STAGE/final``) or a
  Hugging Face folder; its vocabulary must be the student's.

The teacher scores the student's own completion tokens (on-policy) after its own prompt:
``context + prompt`` with a privileged context (``teacher.context``, ``envs.CONTEXTS``: the
answer, a hint, feedback on the student's attempt), which the student never sees; its logits
are divided by ``teacher.temperature``. No gradient reaches a teacher: its forward runs outside
the update, and the update reads its outputs under stop-gradient.

What reads the teacher: the distillation advantages (``opd``, ``gndpo``: sampled-token
log-probs) and the distillation loss term ``teacher.loss`` (``objectives.DIVERGENCES``:
full-vocabulary forward / reverse KL, GKD's JSD, or sampled-token k1/k2/k3), weighted by
``teacher.coef`` for the first ``teacher.steps`` steps (0: all), with the policy loss off
meanwhile unless ``teacher.pg_during`` (the controls ``distill_coef`` and ``pg_coef``).
"""

import dataclasses
import json
import os
import zlib
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from posttrain_jax import envs, models, objectives, parallel, rollout, streams
from posttrain_jax import io as ptio
from posttrain_jax.envs import contexts as contexts_lib
from posttrain_jax.registry import ConfigError
from posttrain_jax.train import context as context_lib
from posttrain_jax.train import inputs as inputs_lib
from posttrain_jax.train import placement as placement_lib
from posttrain_jax.train import state as state_lib
from posttrain_jax.train import teacher_rules, updates

SOURCES = ("start", "policy", "stage", "path")
STAGE = "teacher"  # the stage that trains a teacher of its own (source 'stage')
TEACHER_FIELDS = ("teacher_logprobs", "teacher_logits")


def loss_fn(cfg):
  """The distillation loss term ``config.rl.teacher.loss`` (objectives.DIVERGENCES), or None."""
  name = cfg.teacher.loss
  if not name:
    return None
  return objectives.lookup(objectives.DIVERGENCES, name, "teacher loss")


def is_reference(cfg) -> bool:
  """Whether the teacher is exactly the reference (the frozen RL start seen as the student's
  sampling temperature sees it, no context): its log-probs are the reference's."""
  t = cfg.teacher
  return (
    t.source == "start"
    and t.rule == "never"
    and t.context == "none"
    and float(t.temperature) == float(cfg.temperature)
  )


def own_copy(cfg) -> bool:
  """Whether the teacher is a copy of the policy kept in the run state (refreshed by a rule)."""
  return cfg.teacher.source == "start" and cfg.teacher.rule != "never"


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


# -- loading a teacher of its own -----------------------------------------------------------------
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


# -- the teacher of one run -----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Teacher:
  """The run's teacher (built once by :func:`build`).

  Attributes:
    forward: jitted ``(params, tokens [b, S_T+T], start [b]) -> (log-probs [b, T], logits
      [b, T, V])`` at the teacher's temperature.
    prompt_len: ``S_T``, the teacher's padded prompt length (the student's ``S`` without a
      context).
    source: ``config.rl.teacher.source``.
    fixed: the parameters of a 'stage' or 'path' teacher; None for 'start' and 'policy'.
    context: the privileged context's name ('none': the student's prompt).
    context_kwargs: its arguments.
  """

  forward: Callable
  prompt_len: int
  source: str = "start"
  fixed: object = None
  context: str = "none"
  context_kwargs: tuple = ()

  def params(self, state: dict, ref_params, policy_params):
    """The parameters the teacher runs with this step: its own (a 'stage' or 'path' teacher),
    the policy's ('policy'), its refreshed copy or the RL start ('start')."""
    if self.fixed is not None:
      return self.fixed
    if self.source == "policy":
      return policy_params
    if "teacher" in state:
      return state["teacher"]
    return ref_params


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


def build(ctx, cfg, group: int = 0) -> Teacher | None:
  """The run's teacher, or None when it is the reference (its forward is the reference's) or
  nothing reads it. ``group``: the shared-prompt forward's rows per prompt (context-free
  teachers only)."""
  t = cfg.teacher
  if is_reference(cfg) and not loss_fn(cfg):
    return None
  graphdef, fixed = ctx.graphdef, None
  own = teacher_placement(ctx.config)  # config.rl.teacher.mesh, else the run's
  place = own or ctx.placement
  if t.source == "stage":
    graphdef, target = stage_model(ctx)
    fixed = restore_final(os.path.join(ctx.workdir, STAGE, "final"), target, place)
  elif t.source == "path":
    graphdef, fixed = load_path(t.path, ctx.tokenizer, place)
  if t.context != "none" and not ctx.config.model.hf_path:
    missing = sorted(set(contexts_lib.CHARS) - set(ctx.tokenizer.get_vocab()))
    if missing:
      raise ConfigError(
        f"the run's tokenizer ({ctx.workdir}/tokenizer) lacks the characters {missing} of "
        f"config.rl.teacher.context={t.context!r}: it was built by a run without a context; "
        "use a fresh --workdir (or share pretraining only between runs that set the context)"
      )
  prompt_len = context_prompt_len(ctx, cfg)
  limit = nnx.merge(graphdef, fixed if fixed is not None else ctx.init_params).config.max_seq_len
  if prompt_len + cfg.max_new_tokens > limit:
    raise ConfigError(
      f"the teacher's sequences need {prompt_len + cfg.max_new_tokens} positions (its prompt "
      f"with context {t.context!r} pads to {prompt_len} tokens, plus config.rl."
      f"max_new_tokens={cfg.max_new_tokens}), over its max_seq_len={limit}; raise "
      "config.model.max_seq_len or shorten the context"
    )
  fwd = updates.make_logprob_fn(
    graphdef,
    prompt_len,
    float(t.temperature),
    with_logits=True,
    group=group if t.context == "none" else 0,
  )
  forward = lambda p, tokens, start: fwd(p, tokens, start)
  if own is not None:  # rows go to the teacher's mesh and its outputs come back

    def forward(p, tokens, start):
      n = tokens.shape[0]
      out = fwd(p, *own.rows_here((tokens, start), n))
      return ctx.placement.rows_here(out, n)

  return Teacher(
    forward=forward,
    prompt_len=prompt_len,
    source=t.source,
    fixed=fixed,
    context=t.context,
    context_kwargs=tuple(sorted(dict(t.context_kwargs).items())),
  )


def teacher_inputs(ctx, teacher: Teacher, problems, ro, key):
  """``(tokens [R, S_T+T], start [R])`` the teacher reads: its prompt (``context + prompt`` of
  each row's problem, ``problems`` one per row) and the row's completion. Each process builds
  its own rows."""
  if teacher.context == "none":
    return ro.tokens, ro.start
  R = ro.tokens.shape[0]
  lo, hi = ctx.placement.local_rows(R)
  completion = parallel.local_rows(ro.completion)
  texts = rollout.decode_completions(ctx.tokenizer, completion)
  rng = envs.numpy_rng(
    jax.random.fold_in(jax.random.fold_in(key, streams.tag("teacher_context")), lo)
  )
  kwargs = dict(teacher.context_kwargs)
  prompts = [
    contexts_lib.teacher_prompt(ctx.env, p, text, rng, teacher.context, **kwargs)
    for p, text in zip(problems[lo:hi], texts)
  ]
  prompt_ids, mask = rollout.encode_prompts(
    ctx.tokenizer, _chat(ctx, prompts), length=teacher.prompt_len
  )
  tokens = np.concatenate([prompt_ids, np.asarray(completion, np.int32)], axis=1)
  start = (teacher.prompt_len - mask.sum(axis=1)).astype(np.int32)
  return ctx.placement.from_local((tokens, start), R)


def _chat(ctx, prompts: list[str]) -> list[str]:
  return [context_lib.prompt_text(ctx.tokenizer, p, ctx.chat_template) for p in prompts]


def context_evaluator(ctx, teacher: Teacher, evaluator):
  """``evaluator`` with the teacher's context in every prompt (metrics ``eval/teacher_*``):
  the policy's accuracy with the privileged context, whose gap to ``eval/accuracy`` at step 0
  is OPSD's initial gap G0. A context about the student's attempt (feedback) is built from the
  policy's own greedy completion of each problem, decoded first without the context."""
  if teacher is None or teacher.context == "none":
    return None
  kwargs = dict(teacher.context_kwargs)
  seed = ctx.config.eval.seed
  needs_attempt = getattr(contexts_lib.CONTEXTS[teacher.context], "needs_completion", False)

  def texts(problems, attempts=None):  # each context drawn from the problem's own seed
    rngs = [np.random.default_rng([seed, zlib.crc32(p.uid.encode())]) for p in problems]
    return _chat(
      ctx,
      [
        contexts_lib.teacher_prompt(
          ctx.env, p, attempts[p.uid] if attempts else None, rng, teacher.context, **kwargs
        )
        for p, rng in zip(problems, rngs)
      ],
    )

  with_context = dataclasses.replace(
    evaluator, prompt_texts=texts, prompt_len=teacher.prompt_len, prefix="eval/teacher_"
  )
  if not needs_attempt:
    return with_context

  def evaluate(params, key):
    _, _, _, _, attempts, _ = evaluator._run(evaluator.greedy, params, evaluator.problems, key)
    by_uid = {p.uid: a for p, a in zip(evaluator.problems, attempts)}
    return dataclasses.replace(with_context, prompt_texts=lambda ps: texts(ps, by_uid))(params, key)

  return evaluate


# -- phases, refresh ------------------------------------------------------------------------
def phase_controls(cfg, controls: dict, step: int) -> dict:
  """``controls`` with this step's ``distill_coef`` (``teacher.coef`` during the distillation
  phase, the first ``teacher.steps`` steps or all with 0; else 0) and ``pg_coef`` (0 during the
  phase unless ``teacher.pg_during``, else 1)."""
  t = cfg.teacher
  if not t.loss:
    return controls
  on = not t.steps or step < t.steps
  return {
    **controls,
    "distill_coef": jnp.asarray(t.coef if on else 0.0, jnp.float32),
    "pg_coef": jnp.asarray(0.0 if on and not t.pg_during else 1.0, jnp.float32),
  }


def init_rule_states(cfg) -> dict:
  """The host states of the teacher's and the reference's refresh rules (checkpoint meta)."""
  return {
    "teacher": teacher_rules.init_state(cfg.teacher.rule, **dict(cfg.teacher.rule_kwargs)),
    "reference": teacher_rules.init_state(cfg.ref_rule, **dict(cfg.ref_rule_kwargs)),
  }


def refresh(cfg, state: dict, policy, record: dict, step: int) -> tuple[dict, dict]:
  """After the update of step ``step`` (0-based): each refresh rule decides from the step's
  ``record`` and mixes ``policy`` (the updated policy's full parameters) into the teacher's
  copy (``state['teacher']``) or the reference (``state['reference']``). Returns the new state
  and the rules' metrics (``teacher/*``, ``reference/*``)."""
  states, metrics = dict(state["rule_states"]), {}
  for name, rule, kwargs in (
    ("teacher", cfg.teacher.rule, cfg.teacher.rule_kwargs),
    ("reference", cfg.ref_rule, cfg.ref_rule_kwargs),
  ):
    if name not in state:
      continue
    fn = teacher_rules.lookup(rule)
    mix, states[name], m = fn(states[name], record, step + 1, **dict(kwargs))
    if mix > 0.0:
      state = {**state, name: teacher_rules.blend(state[name], policy, float(mix))}
    prefix = name + "/"
    metrics.update(
      {k if k.startswith(prefix) else prefix + k.split("/", 1)[-1]: float(v) for k, v in m.items()}
    )
  return {**state, "rule_states": states}, metrics


# -- config checks --------------------------------------------------------------------------
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
  for name, rule, kwargs in (
    ("teacher.rule", t.rule, t.rule_kwargs),
    ("ref_rule", cfg.ref_rule, cfg.ref_rule_kwargs),
  ):
    _require(
      rule in teacher_rules.TEACHER_RULES,
      f"config.rl.{name}={rule!r} is unknown; valid rules: "
      f"{', '.join(sorted(teacher_rules.TEACHER_RULES))}",
    )
    teacher_rules.check(rule, dict(kwargs), key=f"config.rl.{name}_kwargs")
  _require(
    t.rule == "never" or t.source == "start",
    f"{key}.rule={t.rule!r} refreshes a copy of the policy; it needs {key}.source="
    f"'start' (the copy starts as the RL start), not {t.source!r}",
  )
  lora = bool(cfg.lora and cfg.lora.rank)
  _require(
    not (lora and (own_copy(cfg) or cfg.ref_rule != "never")),
    "a refreshed teacher or reference copies the full policy; with config.rl.lora the "
    "policy state holds only the adapters: set the rules to 'never' or config.rl.lora."
    "rank=0",
  )
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
