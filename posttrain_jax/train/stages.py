"""The table of stages: an experiment is the list of stages ``config.stages`` names, run in order.

A name in ``config.stages`` is a kind of :data:`STAGES` (``"rl"``), or a stage declared in
``config.stage_specs`` under that name::

    c.stages = ("pretrain", "rl_a", "eval_a", "merge", "rl_b", "eval")
    c.stage_specs = dict(
      rl_a=dict(kind="rl", overrides=dict(env=dict(name="arithmetic", level=2))),
      eval_a=dict(kind="eval", overrides=dict(env=dict(name="arithmetic", level=2))),
      merge=dict(kind="modelop", op="average", inputs=("pretrain", "rl_a")),
      rl_b=dict(kind="rl", overrides=dict(env=dict(name="digit_sum", level=4))),
    )

A spec's keys: ``kind`` (default: the name, when it is a kind); ``start``, the earlier stage
whose final parameters it starts from (``"init"``: the initial parameters; default: the latest
earlier stage that makes a policy, or the initial parameters for pretraining); ``overrides``,
config keys set for this stage only (a dict updates the section of that name key by key, as an
arm does, e.g. ``dict(rl=dict(steps=150), env=dict(name="digit_sum"))``); for ``modelop``,
``op`` (a :data:`~posttrain_jax.modelops.MODEL_OPS` name), ``inputs`` (the stages whose
parameters it combines, ``"init"`` allowed; its start is the first) and ``kwargs``.

Each stage writes ``WORKDIR/<name>/``; a finished stage is loaded on a rerun, an unfinished one
resumes from its checkpoints, and the workdir remembers each stage's config
(train/workdir.py). Two stages of one kind draw the same random streams unless one overrides
``seed``.
"""

import dataclasses
import sys
from typing import Callable

import ml_collections
import numpy as np

from posttrain_jax import modelops, parallel
from posttrain_jax.registry import ConfigError
from posttrain_jax.train import configs, preference, pretrain, rl, search, sft, teacher_model
from posttrain_jax.train import context as context_lib
from posttrain_jax.train import eval_stage as eval_stage_lib
from posttrain_jax.train import reward_model as reward_model_lib

INIT = "init"  # a start that names no stage: the run's initial parameters

# Sections an override may not change: every stage shares the model, its placement and the
# plan itself.
FIXED = (
  "stages",
  "stage_specs",
  "model",
  "mesh",
  "sampler_mesh",
  "distributed",
  "cpu_devices",
  "cpu_threads",
  "compilation_cache_dir",
  "executable_cache",
)
SPEC_KEYS = ("kind", "start", "overrides", "op", "inputs", "kwargs")


@dataclasses.dataclass(frozen=True)
class Stage:
  """One entry of a run's plan. ``config``: the run's config with the stage's overrides (the
  run's own object when it has none); ``start``: a stage name or :data:`INIT`."""

  name: str
  kind: str
  index: int
  start: str
  inputs: tuple
  config: ml_collections.ConfigDict
  spec: dict


@dataclasses.dataclass
class Progress:
  """What the stages of a run have made so far: final parameters by stage name (and
  :data:`INIT`), the plan by name, and the last evaluation's summary."""

  plan: dict
  params: dict
  summary: dict = dataclasses.field(default_factory=dict)


def _trained(ctx, name: str, runner):
  """Final params of stage ``name``: loaded if it finished before, else made now."""
  if ctx.is_done(name):
    params = ctx.load_final(name)  # None: bad final set aside (fallback), finish it again
    if params is not None:
      print(f"[{name}] already finished in {ctx.stage_dir(name)}; skipping", file=sys.stderr)
      return params
  return runner()


def _run_pretrain(ctx, stage: Stage, done: Progress):
  if stage.start != INIT:  # continued pretraining from an earlier stage's parameters
    ctx = dataclasses.replace(ctx, init_params=done.params[stage.start])
  return _trained(ctx, stage.name, lambda: pretrain.run(ctx, stage=stage.name))


def _run_teacher(ctx, stage: Stage, done: Progress):
  tctx = teacher_model.stage_context(ctx)
  overrides = teacher_model.pretrain_overrides(ctx.config)
  _trained(tctx, stage.name, lambda: pretrain.run(tctx, stage=stage.name, **overrides))


def _run_reward_model(ctx, stage: Stage, done: Progress):
  if ctx.is_done(stage.name):
    print(
      f"[{stage.name}] already finished in {ctx.stage_dir(stage.name)}; skipping", file=sys.stderr
    )
  else:
    reward_model_lib.run(ctx, done.params[stage.start])


def _run_sft(ctx, stage: Stage, done: Progress):
  start = done.params[stage.start]
  return _trained(ctx, stage.name, lambda: sft.run(ctx, start, stage=stage.name))


def _run_preference(ctx, stage: Stage, done: Progress):
  start = done.params[stage.start]
  return _trained(ctx, stage.name, lambda: preference.run(ctx, start, stage=stage.name))


def _run_rl(ctx, stage: Stage, done: Progress):
  start = done.params[stage.start]
  return _trained(ctx, stage.name, lambda: rl.run(ctx, start, stage=stage.name))


def _run_search(ctx, stage: Stage, done: Progress):
  start = done.params[stage.start]
  return _trained(ctx, stage.name, lambda: search.run(ctx, start, stage=stage.name))


def _run_modelop(ctx, stage: Stage, done: Progress):
  def apply():
    op = modelops.MODEL_OPS[stage.spec["op"]]
    kwargs = dict(stage.spec.get("kwargs", {}))
    try:
      out = op([done.params[n] for n in stage.inputs], **kwargs)
    except (TypeError, ValueError) as e:
      raise ConfigError(f"config.stage_specs.{stage.name}: {stage.spec['op']}: {e}") from None
    out = ctx.placement.place(out)
    summary = {
      "op": stage.spec["op"],
      "inputs": list(stage.inputs),
      "kwargs": kwargs,
      "distance_from_start": param_distance(out, done.params[stage.start]),
    }
    ctx.save_final(stage.name, out, summary)
    print(f"[{stage.name}] {stage.spec['op']} of {', '.join(stage.inputs)}", file=sys.stderr)
    return out

  return _trained(ctx, stage.name, apply)


def _run_eval(ctx, stage: Stage, done: Progress):
  """Evaluates the start stage's parameters (``after_rl``) against the parameters that stage
  started from (``before_rl``); a start that trained nothing on top of a policy (pretraining,
  the initial parameters) is reported as ``before_rl`` alone."""
  evaluated = done.plan.get(stage.start)
  if evaluated is not None and STAGES[evaluated.kind].continues:
    before, after = done.params[evaluated.start], done.params[stage.start]
  else:
    before, after = done.params[stage.start], None
  # The curve summarised (config.eval.rl_summary): an RL stage's steps or a search's rounds.
  curved = evaluated is not None and evaluated.kind in ("rl", "search")
  rl_dir = evaluated.name if curved else None
  done.summary = eval_stage_lib.run_eval_stage(
    ctx, before, after, stage=stage.name, rl_stage=rl_dir
  )


@dataclasses.dataclass(frozen=True)
class Kind:
  """A kind of stage. ``makes_policy``: its final parameters are a policy a later stage can
  start from; ``continues``: it trains on top of its start (an evaluation after it compares
  the two); ``named``: it must be named as its kind (later stages read its folder by that
  name); ``starts_at_init``: its default start is the initial parameters; ``outputs``:
  workdir entries it writes besides its folder; ``section``: the config section it reads."""

  doc: str
  run: Callable
  makes_policy: bool = False
  continues: bool = False
  named: bool = False
  starts_at_init: bool = False
  outputs: tuple = ()
  section: str = ""


# In rank order: a changed key whose first affected kind is K (declared with each key, train/config_fields/) affects the
# first stage of the run of K or a later kind, and every stage after that one.
STAGES = {
  "pretrain": Kind(
    "next-token training on the env's generated corpus (from the initial parameters, or "
    "continued from `start`)",
    _run_pretrain,
    makes_policy=True,
    starts_at_init=True,
    outputs=("tokenizer",),
    section="pretrain",
  ),
  "teacher": Kind(
    "a teacher of its own (`rl.teacher.source='stage'`): `rl.teacher.preset` pretrained",
    _run_teacher,
    named=True,
  ),
  "reward_model": Kind(
    "a reward model on preference pairs, its trunk from `start` (train/reward_model.py)",
    _run_reward_model,
    named=True,
    section="reward_model",
  ),
  "sft": Kind(
    "supervised fine-tuning from `start` on gold solutions (the env's or a JSONL file's; "
    "train/sft.py)",
    _run_sft,
    makes_policy=True,
    continues=True,
    section="sft",
  ),
  "preference": Kind(
    "DPO / IPO / SimPO / KTO from `start` against `start` as the frozen reference, on pairs "
    "from a JSONL file or the env's verifier (train/preference.py)",
    _run_preference,
    makes_policy=True,
    continues=True,
    section="preference",
  ),
  "rl": Kind(
    "RL from `start`'s parameters (train/rl.py)",
    _run_rl,
    makes_policy=True,
    continues=True,
    section="rl",
  ),
  "search": Kind(
    "gradient-free search from `start`: rewarded weight perturbations consolidated into one "
    "update a round (CoRP, RandOpt, ES; train/search.py)",
    _run_search,
    makes_policy=True,
    continues=True,
    section="search",
  ),
  "modelop": Kind(
    "a weight-space operator (`op`, a MODEL_OPS name) on the final parameters of `inputs`",
    _run_modelop,
    makes_policy=True,
    continues=True,
  ),
  "eval": Kind(
    "greedy accuracy, pass@1 and pass@k of `start` and of what it started from; writes "
    "summary.json",
    _run_eval,
    outputs=("summary.json", "curves.png"),
    section="eval",
  ),
}


def param_distance(a, b) -> float:
  """The L2 distance between two parameter trees (over every leaf, in float64 on the host)."""
  import jax  # pylint: disable=import-outside-toplevel

  leaves = jax.tree.leaves(
    jax.tree.map(lambda x, y: x.astype("float32") - y.astype("float32"), a, b)
  )
  return float(
    np.sqrt(
      sum(float(np.sum(np.square(np.asarray(jax.device_get(x), np.float64)))) for x in leaves)
    )
  )


# -- the plan -------------------------------------------------------------------------------------
def spec_of(config, name: str) -> dict:
  """``config.stage_specs[name]`` as a dict (``{}`` when the stage has none)."""
  specs = config.get("stage_specs", None) or {}
  spec = specs.get(name, None) if hasattr(specs, "get") else None
  if spec is None:
    return {}
  return spec.to_dict() if hasattr(spec, "to_dict") else dict(spec)


def kind_of(name: str, spec: dict) -> str:
  """The kind of stage ``name``: its spec's, else the name itself; ConfigError for neither."""
  kind = spec.get("kind", name if name in STAGES else None)
  if kind is None:
    raise ConfigError(
      f"config.stages has {name!r}, which is no kind of stage and has no spec; add "
      f"config.stage_specs.{name} = dict(kind=...), one of {', '.join(STAGES)}"
    )
  if kind not in STAGES:
    raise ConfigError(
      f"config.stage_specs.{name}.kind={kind!r} is no kind of stage; valid kinds: "
      f"{', '.join(STAGES)}"
    )
  return kind


def plan(config) -> tuple:
  """The stages of ``config`` (validated, complete) in run order, each with its kind, start and
  effective config. ConfigError for a repeated name, an unknown kind or key, a start that is
  not an earlier stage making a policy, or an override of a shared section."""
  names = tuple(config.stages)
  for name in names:
    if not isinstance(name, str) or not name:
      raise ConfigError(f"config.stages must list stage names (strings), got {name!r}")
  repeated = sorted({n for n in names if names.count(n) > 1})
  if repeated:
    raise ConfigError(
      f"config.stages names {repeated} more than once; give each stage its own name"
    )
  if INIT in names:
    raise ConfigError(
      f"config.stages may not name a stage {INIT!r} (it means the initial parameters)"
    )
  out = []
  for index, name in enumerate(names):
    spec = spec_of(config, name)
    unknown = sorted(set(spec) - set(SPEC_KEYS))
    if unknown:
      raise ConfigError(
        f"config.stage_specs.{name} has unknown key(s) {unknown}; valid keys: {', '.join(SPEC_KEYS)}"
      )
    kind = kind_of(name, spec)
    k = STAGES[kind]
    if k.named and name != kind:
      raise ConfigError(
        f"config.stages has {name!r} of kind {kind!r}; a {kind} stage must be named {kind!r} "
        "(later stages read it by that name)"
      )
    policies = [s.name for s in out if STAGES[s.kind].makes_policy]
    inputs = ()
    if kind == "modelop":
      inputs = _modelop_inputs(name, spec, policies)
      start = inputs[0]
    elif "start" in spec:
      start = spec["start"] or INIT
      if start != INIT and start not in policies:
        raise ConfigError(
          f"config.stage_specs.{name}.start={start!r} is not an earlier stage that makes a "
          f"policy; earlier ones: {policies or 'none'} (or {INIT!r})"
        )
    else:
      start = INIT if k.starts_at_init or not policies else policies[-1]
    out.append(Stage(name, kind, index, start, inputs, _stage_config(config, name, spec), spec))
  return tuple(out)


def _modelop_inputs(name: str, spec: dict, policies: list) -> tuple:
  op = spec.get("op", "")
  if op not in modelops.MODEL_OPS:
    raise ConfigError(
      f"config.stage_specs.{name}.op={op!r} is no model operator; valid ops: "
      f"{', '.join(sorted(modelops.MODEL_OPS))}"
    )
  inputs = tuple(spec.get("inputs", ()) or ())
  if not inputs:
    raise ConfigError(f"config.stage_specs.{name}.inputs is empty; list the stages {op} combines")
  bad = [n for n in inputs if n != INIT and n not in policies]
  if bad:
    raise ConfigError(
      f"config.stage_specs.{name}.inputs has {bad}, not earlier stages that make a policy; "
      f"earlier ones: {policies or 'none'} (or {INIT!r})"
    )
  return inputs


def _stage_config(config, name: str, spec: dict):
  """The run's config with the stage's overrides (``config`` itself when it has none)."""
  overrides = spec.get("overrides", {}) or {}
  if not overrides:
    return config
  if not isinstance(overrides, dict):
    raise ConfigError(f"config.stage_specs.{name}.overrides must be a dict of config keys")
  fixed = sorted(k for k in overrides if k in FIXED)
  if fixed:
    raise ConfigError(
      f"config.stage_specs.{name}.overrides sets {fixed}, which every stage shares; set them "
      "on the config itself"
    )
  unknown = sorted(k for k in overrides if k not in config)
  if unknown:
    raise ConfigError(f"config.stage_specs.{name}.overrides sets unknown key(s) {unknown}")
  out = ml_collections.ConfigDict(config.to_dict())
  try:
    configs.apply_arm(out, overrides)
  except ValueError as e:
    raise ConfigError(f"config.stage_specs.{name}.overrides: {e}") from None
  return out


def run_plan(ctx) -> dict:
  """Runs the plan of ``ctx.config`` in order, each stage in its own context; returns the last
  evaluation's summary ({} when the plan has none)."""
  stages = plan(ctx.config)
  done = Progress(plan={s.name: s for s in stages}, params={INIT: ctx.init_params})
  for stage in stages:
    sctx = context_lib.for_stage(ctx, stage.config)
    params = STAGES[stage.kind].run(sctx, stage, done)
    if STAGES[stage.kind].makes_policy:
      done.params[stage.name] = params
  parallel.barrier("stages_done")
  return done.summary
