"""The update's inputs: the typed train batch, the fields the selected pieces read, and one
producer per field (DESIGN.md section 4).

A registry entry declares the fields it reads (``registry.reads``); :func:`required` collects
them for a config, and :func:`build_rows` computes exactly those, each by its producer in
:data:`PRODUCERS` or an active method's (a producer may ask for other fields: the teacher's
log-probs are the reference's until a teacher is configured, ``methods/teacher/``). Fresh rows
and replayed rows go through the same function; only the advantages differ (computed for fresh rows, stored for replayed ones).

Adding a method with a new input: its objectives function tagged ``@registry.reads("x")``,
plus a producer ``"x"`` here or in a method's ``producers`` (``methods/<name>/``, e.g. the
critic's ``values``), and, when the update reads it, an optional field of :class:`TrainBatch`.
"""

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from posttrain_jax import objectives, registry, rollout


@struct.dataclass
class TrainBatch:
  """The rows one update trains on. ``b`` rows, ``S`` prompt and ``T`` completion positions.

  Attributes:
    tokens: [b, S+T] int32 prompt and completion.
    start: [b] int32 first real prompt position (left padding before it).
    mask: [b, T] float32 completion mask times the row's ``valid``.
    old_logprobs: [b, T] float32 the PPO ratio's denominator (behaviour or recomputed).
    behaviour_logprobs: [b, T] float32 the sampler's log-probs.
    is_weights: [b, T] float32 importance weights (the mask when no correction).
    advantages: [b] or [b, T] float32.
    rewards: [b] float32 the verifier's rewards (unshaped).
    group: [b] int32 prompt index.
    valid: [b] float32 1 for a real row, 0 for padding.
    ref_logprobs, ref_logits, teacher_logprobs, teacher_logits: [b, T] (logits [b, T, V])
      float32, or None when no selected piece reads them.
    routes: [b, L, S+T, k] int32 recorded MoE experts (routing replay), or None.
    sft_tokens, sft_mask: [b, L'] int32 / float32 supervised rows trained beside the RL rows
      (a loss term's cross-entropy, e.g. RL+SFT parallel averaging), or None.
  """

  tokens: jax.Array
  start: jax.Array
  mask: jax.Array
  old_logprobs: jax.Array
  behaviour_logprobs: jax.Array
  is_weights: jax.Array
  advantages: jax.Array
  rewards: jax.Array
  group: jax.Array
  valid: jax.Array
  ref_logprobs: jax.Array | None = None
  ref_logits: jax.Array | None = None
  teacher_logprobs: jax.Array | None = None
  teacher_logits: jax.Array | None = None
  routes: jax.Array | None = None
  sft_tokens: jax.Array | None = None
  sft_mask: jax.Array | None = None


OPTIONAL = tuple(f.name for f in dataclasses.fields(TrainBatch) if f.default is None)


class Rows(NamedTuple):
  """Rows before their inputs are computed: a (trimmed) rollout, its row mask and rewards."""

  rollout: rollout.Rollout
  valid: jax.Array  # [b] float32
  rewards: jax.Array  # [b] float32

  @property
  def mask(self) -> jax.Array:
    return self.rollout.completion_mask * self.valid[:, None]


class Sources(NamedTuple):
  """What producers read besides the rows: the run's compiled functions (``train.rl.RLFunctions``),
  ``config.rl``, the policy's full parameters, the reference's, the controller values, the run
  state and the active methods' objects and producers, and for
  fresh rows the step (``step``: its context, run, selection and key)."""

  fns: object
  cfg: object  # config.rl
  params: object
  ref_params: object = None
  controls: dict | None = None
  state: dict | None = None  # the run state (a method's producer reads its own slots)
  methods: dict | None = None  # the active methods' built objects (train/hooks.py)
  producers: dict | None = None  # the active methods' producers, beside PRODUCERS
  step: object = None  # fresh rows: StepInputs (ctx, run, sel, key); None for replayed rows


class StepInputs(NamedTuple):
  """The step a fresh row comes from, for producers that act on the step's prompts (e.g. a
  greedy baseline rollout per prompt): the run's context and ``RLRun``, the scheduler's
  selection and the step's key."""

  ctx: object
  run: object
  sel: object
  key: jax.Array


class Needs(NamedTuple):
  """The fields one run computes: for every row (the update reads them) and for fresh rows
  only (the advantage reads them); ``trainer``: the trainer's log-probs before the update."""

  update: frozenset
  advantage: frozenset
  trainer: bool


# ---------------------------------------------------------------------------------------------
# Producers: field -> fn(sources, rows, fields) -> array. ``fields`` computes (once) any other
# field a producer reads.


def _routes(src: Sources, rows: Rows, fields) -> jax.Array:
  del src, fields
  return rows.rollout.routes


def _trainer_logprobs(src: Sources, rows: Rows, fields) -> jax.Array:
  ro = rows.rollout
  return src.fns.trainer_logprobs(src.params, ro.tokens, ro.start, fields["routes"])


def _ref_forward(src: Sources, rows: Rows, fields):
  ro = rows.rollout
  return src.fns.ref_logprobs(src.ref_params, ro.tokens, ro.start, fields["routes"])


def _ref_logits(src: Sources, rows: Rows, fields) -> jax.Array:
  logprobs, logits = _ref_forward(src, rows, fields)
  fields.put("ref_logprobs", logprobs)  # the same forward
  return logits


def _ref_logprobs(src: Sources, rows: Rows, fields) -> jax.Array:
  out = _ref_forward(src, rows, fields)
  if isinstance(out, tuple):  # the run's reference function also returns logits
    fields.put("ref_logits", out[1])
    return out[0]
  return out


def _shaped_rewards(src: Sources, rows: Rows, fields) -> jax.Array:
  """The rewards the advantage sees: the shaping terms of ``config.rl.reward_shaping`` (name ->
  kwargs, ``objectives.SHAPINGS``) in order, then with the KL in the reward
  ``r - β Σ_t k(π, π_ref)``. The terms' row weights multiply into ``keep``."""
  rewards, keep = rows.rewards, jnp.ones_like(rows.rewards)
  ro = rows.rollout
  shaping_inputs = objectives.ShapingInputs(
    ro.lengths, ro.truncated, src.cfg.max_new_tokens, ro.logprobs, ro.completion_mask
  )
  for name, kwargs in src.cfg.reward_shaping.items():
    fn = registry.lookup(objectives.SHAPINGS, name, "reward shaping")
    if "teacher_logprobs" in registry.reads_of([fn]):  # e.g. CME's verifier log-probs
      shaping_inputs = shaping_inputs._replace(teacher_logprobs=fields["teacher_logprobs"])
    rewards, weight, metrics = fn(rewards, shaping_inputs, **dict(kwargs))
    keep = keep * weight
    for k, v in metrics.items():
      fields.metric(k, v)
  fields.put("keep", keep)
  fields.put("task_rewards", rewards)
  if not (src.cfg.kl_coef and src.cfg.kl_in_reward):
    return rewards
  seq_kl = jnp.sum(fields["token_kl"], axis=1)
  fields.metric("kl/ref", jnp.mean(seq_kl / jnp.maximum(rows.rollout.lengths, 1)))
  return rewards - src.controls["kl_coef"] * seq_kl


def _token_kl(src: Sources, rows: Rows, fields) -> jax.Array:
  """[b, T] the sampled KL estimate ``k(π, π_ref)`` at every completion token (0 elsewhere)."""
  kl_fn = registry.lookup(objectives.KL_ESTIMATORS, src.cfg.kl_estimator, "KL estimator")
  mask = rows.rollout.completion_mask
  kwargs = dict(src.cfg.kl_estimator_kwargs)
  token_kl = kl_fn(fields["trainer_logprobs"], fields["ref_logprobs"], **kwargs)
  return jnp.where(mask > 0, token_kl * mask, 0.0)


def _token_rewards(src: Sources, rows: Rows, fields) -> jax.Array:
  """[b, T] per-token rewards for token-level estimators (GAE, REINFORCE++ returns-to-go): the
  task reward on the last token, and with ``config.rl.kl_per_token`` (REINFORCE++ / PPO's k1
  shaping) ``-β k_t`` at every token instead of their sum on the last one. Either way a row's
  token rewards sum to its shaped reward."""
  mask = rows.mask
  if src.cfg.kl_coef and src.cfg.kl_in_reward and src.cfg.kl_per_token:
    fields["shaped_rewards"]  # pylint: disable=pointless-statement  (task rewards, kl/ref)
    terminal = objectives.terminal_rewards(fields["task_rewards"], mask)
    return terminal - src.controls["kl_coef"] * fields["token_kl"] * mask
  return objectives.terminal_rewards(fields["shaped_rewards"], mask)


def _keep(src: Sources, rows: Rows, fields) -> jax.Array:
  """[b] row weights of the shaping terms (1: in the loss); made with the shaped rewards."""
  del src, rows
  fields["shaped_rewards"]  # pylint: disable=pointless-statement
  return fields.get("keep")


def completion_milestones(tokenizer, completion, lengths):
  """``objectives.milestone_keys`` of completion ids [B, T], each token decoded on its own."""
  pieces = [[tokenizer.decode([int(t)]) for t in row] for row in completion]
  return objectives.milestone_keys(pieces, lengths)


def _milestones(src: Sources, rows: Rows, fields) -> jax.Array:
  """[b, T] int32 Numca state keys of the fresh rows' completions (objectives.state_values),
  parsed on the host from each token's text."""
  del fields
  ro = rows.rollout
  tokenizer = src.step.ctx.tokenizer
  completion, lengths = jax.device_get((ro.completion, ro.lengths))
  keys = completion_milestones(tokenizer, completion, lengths)
  return src.step.ctx.placement.put_rows(keys, keys.shape[0])


def _hidden(src: Sources, rows: Rows, fields) -> jax.Array:
  """[b, T, D] the policy's last-layer hidden state before each completion token (Hista)."""
  del fields
  ro = rows.rollout
  return src.fns.hidden(src.params, ro.tokens, ro.start)


PRODUCERS: dict[str, Callable] = {
  "milestones": _milestones,
  "hidden": _hidden,
  "routes": _routes,
  "trainer_logprobs": _trainer_logprobs,
  "ref_logits": _ref_logits,
  "ref_logprobs": _ref_logprobs,
  "shaped_rewards": _shaped_rewards,
  "keep": _keep,
  "token_kl": _token_kl,
  "token_rewards": _token_rewards,
}


class Fields:
  """The rows' fields, each computed on first use by its producer and kept."""

  def __init__(self, src: Sources, rows: Rows, producers: dict = PRODUCERS):
    self.src, self.rows, self.producers = src, rows, producers
    self.values: dict = {}
    self.metrics: dict = {}

  def __getitem__(self, name: str):
    if name not in self.values:
      self.values[name] = registry.lookup(self.producers, name, "input field")(
        self.src, self.rows, self
      )
    return self.values[name]

  def ensure(self, names) -> None:
    """Computes every field of ``names`` (sorted, so the order does not depend on a set's)."""
    for name in sorted(names):
      self[name]  # pylint: disable=pointless-statement

  def get(self, name: str, default=None):
    """The field if computed already (no producer runs), else ``default``."""
    return self.values.get(name, default)

  def put(self, name: str, value) -> None:
    self.values[name] = value

  def metric(self, name: str, value) -> None:
    self.metrics[name] = value


def required(cfg) -> Needs:
  """The fields the pieces ``config.rl`` selects read (their ``reads`` tags) and the ones its
  settings imply: the KL term (reference log-probs, or logits for the exact KL), the KL in the
  reward, an IS correction or recomputed old log-probs (the trainer's log-probs), routing
  replay (the recorded routes), the teacher's distillation term and refresh
  rule (the teacher's log-probs or logits)."""
  advantage = registry.lookup(objectives.ADVANTAGES, cfg.advantage, "advantage")
  loss = registry.lookup(objectives.POLICY_LOSSES, cfg.policy_loss, "policy loss")
  update = set(registry.reads_of([loss]))
  fresh = set(registry.reads_of([advantage])) | {"shaped_rewards"}
  fresh |= set(
    registry.reads_of(
      registry.lookup(objectives.SHAPINGS, name, "reward shaping") for name in cfg.reward_shaping
    )
  )
  if cfg.kl_coef and not cfg.kl_in_reward:
    update.add("ref_logits" if cfg.kl_estimator.startswith("full_") else "ref_logprobs")
  trainer = (
    cfg.is_correction != "none"
    or cfg.old_logprobs == "recomputed"
    or bool(cfg.kl_coef and cfg.kl_in_reward)
  )
  if cfg.kl_coef and cfg.kl_in_reward:
    fresh |= {"trainer_logprobs", "ref_logprobs"}
  if cfg.routing_replay:
    update.add("routes")
  if cfg.teacher.loss:  # the distillation term: the teacher's log-probs or logits
    divergence = registry.lookup(objectives.DIVERGENCES, cfg.teacher.loss, "teacher loss")
    update |= set(registry.reads_of([divergence]))
  if cfg.teacher.rule != "never":  # the refresh rule's diagnostics (teacher/kl)
    fresh.add("teacher_logprobs")
  return Needs(frozenset(update), frozenset(fresh - update), trainer)


def with_update_fields(needs: Needs, names) -> Needs:
  """``needs`` with the fields ``names`` also computed for every row (read by the update, e.g.
  an active loss term's inputs)."""
  update = needs.update | frozenset(names)
  return Needs(update, needs.advantage - update, needs.trainer)


def build_rows(
  src: Sources, rows: Rows, needs: Needs, *, advantages: jax.Array | None = None
) -> tuple[TrainBatch, Fields, dict]:
  """The update's rows from ``rows``: the fields ``needs`` names, the advantages (computed
  here for fresh rows, given for replayed ones), the IS weights and old log-probs.

  Returns ``(batch, fields, metrics)``; ``fields`` keeps every computed field (a method's
  batch reads its values).
  """
  fns, ro = src.fns, rows.rollout
  fields = Fields(src, rows, {**PRODUCERS, **(src.producers or {})})
  fields.ensure(needs.update)
  metrics = {}
  mask = rows.mask
  if advantages is None:
    fields.ensure(needs.advantage)
    mask = mask * fields["keep"][:, None]  # rows a shaping term drops (e.g. truncated ones)
    advantages, adv_metrics = fns.advantages(
      objectives.AdvantageInputs(
        rewards=fields["shaped_rewards"],
        group=ro.group,
        valid=rows.valid,
        mask=rows.mask,
        logprobs=ro.logprobs,
        teacher_logprobs=fields.get("teacher_logprobs"),
        values=fields.get("values"),
        baseline_rewards=fields.get("baseline_rewards"),
        token_rewards=fields.get("token_rewards"),
        milestones=fields.get("milestones"),
        hidden=fields.get("hidden"),
      )
    )
    metrics.update(adv_metrics)
  weights = mask
  trainer = fields["trainer_logprobs"] if needs.trainer else None
  if trainer is not None:  # else the mismatch metrics come from the update's own forward
    weights, is_metrics = fns.is_weights(trainer, ro.logprobs, mask)
    metrics.update(is_metrics)
    metrics.update(fns.mismatch(trainer, ro.logprobs, mask))
  old = trainer if src.cfg.old_logprobs == "recomputed" else ro.logprobs
  metrics.update(fields.metrics)
  batch = TrainBatch(
    tokens=ro.tokens,
    start=ro.start,
    mask=mask,
    old_logprobs=old,
    behaviour_logprobs=ro.logprobs,
    is_weights=weights,
    advantages=advantages,
    rewards=rows.rewards,
    group=ro.group,
    valid=rows.valid,
    **{name: fields[name] for name in needs.update if name in OPTIONAL},
  )
  return batch, fields, metrics
