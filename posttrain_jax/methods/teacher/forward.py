"""The teacher of on-policy distillation (``config.rl.teacher``; docs/teachers.md): its forward,
its inputs, its batch fields, its distillation phase and the refresh of its copy.

One concept with several sources (``teacher.source``):

- ``start``: the RL start's parameters, i.e. the reference. With a refresh rule
  (``teacher.rule``, :data:`~posttrain_jax.objectives.refresh_rules.REFRESH_RULES`: ``every``,
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
import os
import zlib
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posttrain_jax import envs, objectives, parallel, rollout, streams
from posttrain_jax.envs import contexts as contexts_lib
from posttrain_jax.objectives import refresh_rules
from posttrain_jax.registry import ConfigError
from posttrain_jax.train import context as context_lib
from posttrain_jax.train import prompts as prompts_lib
from posttrain_jax.train import teacher_model, updates

SOURCES = ("start", "policy", "stage", "path")
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


def build(ctx, cfg, group: int = 0) -> Teacher | None:
  """The run's teacher, or None when it is the reference (its forward is the reference's) or
  nothing reads it. ``group``: the shared-prompt forward's rows per prompt (context-free
  teachers only)."""
  t = cfg.teacher
  if is_reference(cfg) and not loss_fn(cfg):
    return None
  graphdef, fixed = ctx.graphdef, None
  own = teacher_model.teacher_placement(ctx.config)  # config.rl.teacher.mesh, else the run's
  place = own or ctx.placement
  if t.source == "stage":
    graphdef, target = teacher_model.stage_model(ctx)
    fixed = teacher_model.restore_final(
      os.path.join(ctx.workdir, teacher_model.STAGE, "final"), target, place
    )
  elif t.source == "path":
    graphdef, fixed = teacher_model.load_path(t.path, ctx.tokenizer, place)
  if t.context != "none" and not ctx.config.model.hf_path:
    missing = sorted(set(contexts_lib.CHARS) - set(ctx.tokenizer.get_vocab()))
    if missing:
      raise ConfigError(
        f"the run's tokenizer ({ctx.workdir}/tokenizer) lacks the characters {missing} of "
        f"config.rl.teacher.context={t.context!r}: it was built by a run without a context; "
        "use a fresh --workdir (or share pretraining only between runs that set the context)"
      )
  prompt_len = teacher_model.context_prompt_len(ctx, cfg)
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


def refresh(cfg, state: dict, policy, record: dict, step: int) -> tuple[dict, dict]:
  """After the update of step ``step`` (0-based): the teacher's refresh rule decides from the
  step's ``record`` and mixes ``policy`` (the updated policy's full parameters) into the
  teacher's copy (``state['teacher']``). Returns the new state and the rule's metrics
  (``teacher/*``)."""
  fn = refresh_rules.lookup(cfg.teacher.rule)
  mix, rule_state, m = fn(state["teacher_rule"], record, step + 1, **dict(cfg.teacher.rule_kwargs))
  state = {**state, "teacher_rule": rule_state}
  if mix > 0.0:
    state["teacher"] = refresh_rules.blend(state["teacher"], policy, float(mix))
  return state, {
    k if k.startswith("teacher/") else "teacher/" + k.split("/", 1)[-1]: float(v)
    for k, v in m.items()
  }


# -- the batch fields ------------------------------------------------------------------------------
def _forward(src, rows, fields):
  """The teacher's ``(log-probs [b, T], logits [b, T, V])`` of the rows' completion tokens (one
  forward, after its own prompt: with a privileged context, the row's problem's)."""
  del fields
  teacher = src.methods["teacher"]
  params = teacher.params(src.state, src.ref_params, src.params)
  ro = rows.rollout
  if teacher.context == "none":
    return teacher.forward(params, ro.tokens, ro.start)
  step = src.step  # fresh rows only: checks refuse a context with replayed rows
  problems = prompts_lib.row_problems(step.sel.problems, step.sel.group)
  tokens, start = teacher_inputs(step.ctx, teacher, problems, ro, step.key)
  return teacher.forward(params, tokens, start)


def _logprobs(src, rows, fields) -> jax.Array:
  """The teacher's log-probs of the sampled tokens: the reference's when the teacher is the
  reference (no teacher built), else the teacher's own forward; logs ``teacher/kl``, the k3
  estimate of KL(student ‖ teacher) on the student's samples (CGTR's temporal KL)."""
  if src.methods.get("teacher") is None:
    logprobs = fields["ref_logprobs"]
  else:
    logprobs = fields["teacher_forward"][0]
  kl = objectives.KL_ESTIMATORS["k3"](rows.rollout.logprobs, logprobs)
  fields.metric("teacher/kl", objectives.masked_mean(kl, rows.mask))
  return logprobs


def _logits(src, rows, fields) -> jax.Array:
  """[b, T, V] the teacher's logits (full-vocabulary distillation losses)."""
  fields["teacher_logprobs"]  # pylint: disable=pointless-statement  (teacher/kl)
  return fields["teacher_forward"][1]


PRODUCERS = {"teacher_forward": _forward, "teacher_logprobs": _logprobs, "teacher_logits": _logits}
