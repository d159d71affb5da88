"""The engine's side of a method (DESIGN.md section 4): the :class:`Method` record and the fixed
phases of the generic RL step at which the engine calls the active methods' hooks.

A method that is more than one registry entry (it keeps state, trains a second model, acts at
a phase of the step) lives in ``posttrain_jax/methods/<name>/`` and is one :class:`Method` in
the ``METHODS`` table there. The engine never names a method: it is handed the table
(``experiment.run(..., methods=...)``, ``make_context(..., methods=...)``) and calls, for the
methods whose ``active(config)`` holds, in the table's order:

=================  =================================================================
phase              where, and what the hook returns
=================  =================================================================
``check``          validation, before anything runs: raises ConfigError
``build``          the RL stage's setup: the method's host object (``run.methods[name]``)
``prompts``        the RL stage's setup: a dataset its prompts come from instead
``producers``      batch fields it makes (``train.inputs``: ``fn(sources, rows, fields)``)
``init_state``     the RL stage's setup: extra slots of the checkpointed run state
``prefix``         each draw round, before sampling: a :class:`Prefix` some rows continue
``route_shift``    each step, before sampling: [L, D, E] selection shifts of the rollouts'
                   MoE routing (``models.moe.route``), or None
``after_rollouts`` after sampling and scoring: ``(gen, state, metrics)``
``before_update``  before the policy update: the controls the update reads
``side_update``    after the policy update: ``(state, metrics)`` (a second model's update)
``after_update``   after the update's metrics are on the host: ``(state, metrics)``
``evaluate``       the eval stage: ``params -> {name: value}`` per evaluated policy
``rl_evaluator``   the RL stage's periodic evaluation: an extra evaluator, or None
``turns``          every sampler of the run: the turns of a multi-turn episode (stop
                   tokens, observation budget, a responder; train/samplers.py)
=================  =================================================================

Two questions the engine asks the active methods before it builds the RL stage:
``reads_reference(config)`` (the reference's forward must run, e.g. a teacher that is the
reference) and ``reads_start(config)`` (the frozen RL start must be kept).

Every hook takes the method's built object ``built`` (None without ``build``) and a per-step
``scratch`` dict where a method leaves what a later phase of the same step reads.
"""

import dataclasses
from typing import Any, Callable, NamedTuple

from posttrain_jax import fields as fields_lib
from posttrain_jax.train import config_fields

Hook = Callable[..., Any] | None


class Prefix(NamedTuple):
  """Tokens some rows of a draw round continue from (inserted, not sampled, not scored).

  ``ids`` [R, T] int32 and ``lengths`` [R] int32 (0: the row starts clean); ``metrics`` host
  scalars; ``finish(ro, rewards, valid) -> (rollout, metrics)`` is called after scoring (e.g.
  to put the prefix's tokens back into the loss mask)."""

  ids: Any
  lengths: Any
  metrics: dict
  finish: Callable | None = None


@dataclasses.dataclass(frozen=True)
class Method:
  """One method's record in the ``METHODS`` table.

  Attributes:
    name: unique; the key of its built object in ``run.methods``.
    section: the config section it owns (``'rl.save'``), for messages and docs.
    active: ``config -> bool``: whether a run uses it.
    doc: the docs page that explains it (``docs/save.md``).
    check: ``config -> None``; raises ConfigError (only called when active).
    build: ``(ctx, init_params) -> object``; its host-side object (models, jitted functions);
      ``init_params``: the RL stage's start.
    init_state: ``(ctx, built, init_params) -> dict``: slots added to the run state (arrays,
      checkpointed with the policy); ``host_state`` names those kept in the checkpoint meta.
    producers: ``{field: fn(sources, rows, fields) -> array}`` added to ``train.inputs``'
      producers (``sources.methods[name]`` is its built object, ``sources.state`` the run
      state).
    stages: the stages whose outputs it reads (``('teacher',)``), listed in
      docs/reference.md.
    prompts: ``(ctx, built) -> envs.StaticDataset``: the RL stage draws its prompts from this
      dataset, all its levels, instead of the env or ``config.env.dataset`` (the pass-rate
      band's curated pool, methods/pass_band/); at most one active method has it.
    prefix: ``(ctx, run, built, sel, verifier, key) -> Prefix | None``.
    route_shift: ``(ctx, run, built, state) -> [L, D, E] array | None``: the step's rollouts
      route each token to ``TopK(g + x shift[l])`` (PR2); the synchronous loop only.
    after_rollouts: ``(ctx, run, built, state, gen, key, step, scratch) -> (gen, state,
      metrics)``; ``sync_only``: skipped with an asynchronous producer.
    before_update: ``(ctx, run, built, controls, batch, step, scratch) -> controls``.
    side_update: ``(ctx, run, built, state, scratch) -> (state, metrics)``.
    after_update: ``(ctx, run, built, state, record, step, scratch) -> (state, metrics)``.
    finish: ``(ctx, built, state, stage) -> None``: after the RL stage's last step, before
      its final parameters are written (the critic keeps its own: ``ctx.save_params``).
    evaluate: ``(ctx) -> callable(params) -> dict`` or None; the eval stage writes each value
      as ``{key}_{before_rl|after_rl}``.
    state_values: ``(ctx, rl_stage) -> callable(name) -> values | None``: the method's value
      of each completion-token state, scored by SVEB beside the library's estimators
      (train/value_benchmark.py); ``name`` is ``before_rl`` or ``after_rl``, ``values`` a
      function ``(tokens [B, S+T], start [B]) -> [B, T]`` (V before each completion token), or
      None when the method has no values for that policy.
    rl_evaluator: ``(ctx, built, evaluator) -> evaluator | None``: another evaluator of the RL
      stage's periodic evaluation (its metrics merged with the run's).
    turns: ``(ctx, task) -> turns``: the run's samplers become multi-turn (at most one active
      method has it): ``turns.stop_ids``, ``obs_budget``, ``levels``, ``responder(problems,
      rows)``, ``metrics(ro, real)``, ``call_counts(env_mask)`` (methods/agent/'s ToolTurns).
    reads_reference: ``config -> bool``: whether it needs the reference's forward.
    reads_start: ``config -> bool``: whether it reads the frozen RL start's parameters.
    loss_settings: ``config -> dict``: fields of ``updates.RLLossConfig`` it sets (the teacher's
      distillation term, a LOSS_TERMS entry).
    sampler_settings: ``config -> dict``: fields of ``rollout.SamplerConfig`` it sets on the RL
      sampler (PR2's ``shift_gates``).
    fields: ``{"rl.save": fields.Section}``: the config sections it declares (in its folder's
      ``fields.py``), added to the engine's (:func:`config_root`).
  """

  name: str
  section: str
  active: Callable[[Any], bool]
  doc: str = ""
  check: Hook = None
  build: Hook = None
  init_state: Hook = None
  host_state: tuple = ()
  producers: dict = dataclasses.field(default_factory=dict)
  stages: tuple = ()
  prompts: Hook = None
  prefix: Hook = None
  route_shift: Hook = None
  after_rollouts: Hook = None
  sync_only: bool = False
  before_update: Hook = None
  side_update: Hook = None
  after_update: Hook = None
  finish: Hook = None
  evaluate: Hook = None
  state_values: Hook = None
  rl_evaluator: Hook = None
  turns: Hook = None
  reads_reference: Callable[[Any], bool] | None = None
  reads_start: Callable[[Any], bool] | None = None
  loss_settings: Callable[[Any], dict] | None = None
  sampler_settings: Callable[[Any], dict] | None = None
  fields: dict = dataclasses.field(default_factory=dict)


PHASES = (
  "check",
  "build",
  "prompts",
  "init_state",
  "prefix",
  "route_shift",
  "after_rollouts",
  "before_update",
  "side_update",
  "after_update",
  "finish",
  "evaluate",
  "state_values",
  "rl_evaluator",
  "turns",
)


def check_table(methods) -> None:
  """ValueError for a table with a repeated name (the key of ``run.methods``) or a config
  section two methods (or a method and the engine) declare."""
  names = [m.name for m in methods]
  repeated = sorted({n for n in names if names.count(n) > 1})
  if repeated:
    raise ValueError(f"METHODS names {repeated} more than once; each name must be unique")
  config_root(methods)


def config_root(methods) -> fields_lib.Section:
  """The whole config's declaration: the engine's sections (train/config_fields/) with the
  sections the ``methods`` declare (``Method.fields``). ValueError for a section declared
  twice."""
  root = config_fields.ROOT
  for m in methods:
    root = fields_lib.merge(root, m.fields)
  return root


def active(methods, config) -> tuple:
  """The methods of ``methods`` that ``config`` uses, in table order."""
  return tuple(m for m in methods if m.active(config))


def with_hook(methods, config, phase: str) -> tuple:
  """The active methods that have a ``phase`` hook, in table order."""
  return tuple(m for m in active(methods, config) if getattr(m, phase) is not None)


def asks(methods, config, question: str) -> bool:
  """Whether an active method answers yes to ``question`` (``reads_reference``, ``reads_start``)."""
  return any(m(config) for m in (getattr(x, question) for x in active(methods, config)) if m)


def loss_settings(methods, config) -> dict:
  """The loss settings the active methods give (``Method.loss_settings``); ValueError when two
  set one field."""
  return _settings(methods, config, "loss_settings")


def sampler_settings(methods, config) -> dict:
  """The RL sampler's settings the active methods give (``Method.sampler_settings``: fields of
  ``rollout.SamplerConfig``); ValueError when two set one field."""
  return _settings(methods, config, "sampler_settings")


def _settings(methods, config, kind: str) -> dict:
  out = {}
  for m in active(methods, config):
    if getattr(m, kind) is None:
      continue
    given = getattr(m, kind)(config)
    clash = set(given) & set(out)
    if clash:
      what = kind.replace("_", " ")
      raise ValueError(f"method {m.name!r} sets {what} {sorted(clash)} another sets")
    out.update(given)
  return out


def run_checks(methods, config) -> None:
  for m in with_hook(methods, config, "check"):
    m.check(config)


def build_all(ctx, init_params) -> dict:
  """``{name: built object}`` of the active methods (None for those without ``build``).
  ValueError when two active methods give prefixes (a row continues from one prefix)."""
  for phase, what in (
    ("prefix", "prefixes"),
    ("route_shift", "routing shift"),
    ("prompts", "prompts"),
  ):
    given = [m.name for m in with_hook(ctx.methods, ctx.config, phase)]
    if len(given) > 1:
      raise ValueError(f"methods {given} each give the rollouts' {what}; turn all but one off")
  return {
    m.name: (m.build(ctx, init_params) if m.build is not None else None)
    for m in active(ctx.methods, ctx.config)
  }


def route_shift(ctx, run, state):
  """The step's routing shift from the active method with a ``route_shift`` hook (at most one:
  checked when the run is built), or None."""
  for m in with_hook(ctx.methods, ctx.config, "route_shift"):
    return m.route_shift(ctx, run, run.methods[m.name], state)
  return None


def prompt_dataset(ctx, built: dict):
  """The dataset the active method with a ``prompts`` hook gives (at most one: checked when
  the run is built), or None."""
  for m in with_hook(ctx.methods, ctx.config, "prompts"):
    return m.prompts(ctx, built[m.name])
  return None


def init_states(ctx, built: dict, init_params) -> dict:
  """The run-state slots every active method adds; ValueError when two add the same slot."""
  out = {}
  for m in with_hook(ctx.methods, ctx.config, "init_state"):
    slots = m.init_state(ctx, built[m.name], init_params)
    clash = set(slots) & set(out)
    if clash:
      raise ValueError(f"method {m.name!r} adds run-state slots {sorted(clash)} another added")
    out.update(slots)
  return out


def producers(methods, config) -> dict:
  """The batch-field producers the active methods add; ValueError when two make one field."""
  out = {}
  for m in active(methods, config):
    clash = set(m.producers) & set(out)
    if clash:
      raise ValueError(f"method {m.name!r} makes fields {sorted(clash)} another method makes")
    out.update(m.producers)
  return out


def host_state_keys(methods, config) -> tuple:
  """Run-state slots kept in the checkpoint's meta (host values), not as arrays."""
  return tuple(k for m in active(methods, config) for k in m.host_state)
