"""Configs from declarations (``train/config_fields/`` and the methods' ``fields.py``): the
defaults of a declaration and their completion of a config, arms, the sweep section, and
``arg`` parsing. Experiment files import ``posttrain_jax.defaults``, which adds every method's
sections and the reproductions' shared bases.

``get_config(arg)`` of an experiment file receives the text after ``:`` in
``--config=experiments/NAME.py:ARG``. :func:`parse_arg` reads it big_vision-style:
``"smoke,seed=3"`` -> ``ConfigDict(smoke=True, seed=3)``.
"""

import copy

import ml_collections

from posttrain_jax import fields
from posttrain_jax.train import config_fields


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """Parses ``"flag,key=value"`` into a ConfigDict; values take the type of their default."""
  out = ml_collections.ConfigDict(defaults)
  for item in filter(None, (arg or "").split(",")):
    key, _, value = item.partition("=")
    if key not in defaults:
      raise ValueError(f"unknown config arg {key!r}; valid args: {', '.join(sorted(defaults))}")
    if not _:
      out[key] = True
    elif isinstance(defaults[key], bool):
      out[key] = value.lower() in ("1", "true", "yes")
    else:
      out[key] = type(defaults[key])(value)
  return out


def base_config(root: fields.Section | None = None) -> ml_collections.ConfigDict:
  """The defaults of ``root`` (``train.hooks.config_root(methods)``: the engine's sections and
  the methods'; default the engine's alone, train/config_fields/). Experiment files use
  ``posttrain_jax.defaults.base_config``, which passes every method's."""
  return fields.to_config(config_fields.ROOT if root is None else root)


def complete(config: ml_collections.ConfigDict, root=None) -> ml_collections.ConfigDict:
  """Fills in place every key of :func:`base_config` of ``root`` that ``config`` lacks (its own
  values win; free-form sections such as ``*kwargs`` are not filled). The one place defaults
  are applied: code after :func:`~posttrain_jax.train.validate.validate` reads keys as
  attributes. A locked config (the command line's) is filled too: defaults are not new keys a
  user could have misspelt."""
  with config.unlocked():
    _fill(config, base_config(root))
  return config


def _fill(section: ml_collections.ConfigDict, base: ml_collections.ConfigDict) -> None:
  for key in base.keys():
    value = base[key]
    if key not in section:
      section[key] = copy.deepcopy(value)
    elif (
      isinstance(value, ml_collections.ConfigDict)
      and not key.endswith(_FREE_FORM)
      and isinstance(section[key], ml_collections.ConfigDict)
    ):
      _fill(section[key], value)


def parse_arm_arg(arg: str | None, arms, default: str) -> ml_collections.ConfigDict:
  """A reproduction config's ``arg`` (``smoke``, ``seed=N``, ``arm=NAME``); an unknown arm
  raises a ValueError listing the valid ones."""
  args = parse_arg(arg, smoke=False, seed=0, arm=default)
  if args.arm not in arms:
    raise ValueError(f"unknown arm {args.arm!r}; valid arms: {', '.join(arms)}")
  return args


def make_smoke(
  c: ml_collections.ConfigDict, *, rl_steps: int = 2, group_size: int = 4, pass_k: int = 2
) -> ml_collections.ConfigDict:
  """Shrinks ``c`` in place to a seconds-long run (nano model, a few steps) for tests."""
  c.model.preset = "nano"
  c.tensorboard = False
  c.pretrain.update(steps=4, batch_size=16, eval_every=2, eval_problems=16, checkpoint_every=2)
  c.rl.update(
    steps=rl_steps,
    prompts_per_step=4,
    group_size=group_size,
    eval_every=1,
    eval_problems=16,
    checkpoint_every=2,
  )
  c.eval.update(num_problems=16, batch_size=16, pass_k=pass_k, pass_n=2 * pass_k, pass_problems=8)
  return c


# Config sections whose keys are free-form (a piece's keyword arguments, shaping terms by name):
# an arm replaces them whole instead of updating them key by key.
_FREE_FORM = ("kwargs", "reward_shaping", "stage_specs", "terms")


def apply_arm(section: ml_collections.ConfigDict, overrides: dict) -> None:
  """Sets an arm's ``overrides`` (key -> value) on a config section, e.g. ``c.rl``: a dict
  value updates the sub-section of that name key by key (``{"dcmdp": {"enabled": True}}``),
  except free-form sections (``*kwargs``, ``reward_shaping``), which it replaces whole."""
  for key, value in overrides.items():
    if isinstance(value, dict) and key.endswith(_FREE_FORM):
      section[key] = ml_collections.ConfigDict(value)
    elif isinstance(value, dict):
      if key not in section:
        raise ValueError(f"arm override {key!r}: the config has no section of that name")
      apply_arm(section[key], value)
    else:
      section[key] = value


def sweep(
  *,
  title: str,
  arms,
  baseline: str,
  claim: dict,
  metrics,
  shared_stages=("pretrain",),
  curves=("reward/mean", "eval/accuracy"),
  notes=(),
  base_health: dict | None = None,
  engaged: dict | None = None,
  program: str = "run",
  clock_metrics=(),
) -> ml_collections.ConfigDict:
  """A reproduction's ``config.sweep`` (scripts/reproduce.py): its arms (the first metric is the
  claim's unless ``claim['metric']`` says otherwise), the baseline arm of the paired tests, the
  paper's claim (``text``, ``arm``, ``metric``, ``direction`` 'higher' or 'lower') declared
  before the runs, the stages the arms share per seed, the curves to plot, notes (settings and
  reasons, never results) and the base-health gate (``metric``, ``floor`` and optionally
  ``arm``, the arm whose evaluation of the shared start is checked: a seed whose shared start
  scores below the floor is replaced, sweeps/reproduce.py), and the mechanism check
  (``engaged``: ``text``, ``arm``, ``metric`` and either ``above`` (a number) or
  ``versus_metric`` (another key of the same run): per seed, whether the method's mechanism
  acted at all; the table counts the seeds, and a verdict resting on fewer than half says so;
  ``after_runs=True`` when it was declared after results were seen).
  ``program``: what one arm x seed
  job is: ``run`` (an experiment run) or ``study`` (a hyperparameter study of the arm's
  ``config.hpo``, sweeps/hpo.py, whose summary.json the table reads). ``clock_metrics``: the
  metrics (of ``metrics``) measured on the wall or CPU clock, or decided by it (what a budget of
  CPU seconds found): no setting makes them identical on a rerun, so a rerun check reports their
  change beside the others' rather than as the table's largest (sweeps/rerun_check.py)."""
  arms = tuple(arms)
  clock_metrics = tuple(clock_metrics)
  if not set(clock_metrics) <= set(metrics):
    raise ValueError(
      f"sweep clock_metrics {sorted(set(clock_metrics) - set(metrics))} are not among the "
      f"table's metrics {tuple(metrics)}: name metrics the table reports"
    )
  if program not in ("run", "study"):
    raise ValueError(f"sweep program must be 'run' or 'study', got {program!r}")
  if program == "study" and (tuple(shared_stages) or base_health is not None):
    raise ValueError(
      "a sweep of studies shares no stage and has no base-health gate (its studies make their bases)"
    )
  missing = sorted({"text", "arm", "metric", "direction"} - set(claim))
  if missing:
    raise ValueError(f"sweep claim lacks {missing}")
  if baseline not in arms or claim["arm"] not in arms:
    raise ValueError(
      f"sweep baseline {baseline!r} and claim arm {claim['arm']!r} must be arms of {arms}"
    )
  if claim["direction"] not in ("higher", "lower"):
    raise ValueError(
      f"sweep claim direction must be 'higher' or 'lower', got {claim['direction']!r}"
    )
  if base_health is not None and (
    not {"metric", "floor"} <= set(base_health) <= {"metric", "floor", "arm"}
    or not isinstance(base_health["floor"], (int, float))
    or base_health.get("arm", baseline) not in arms
  ):
    raise ValueError(
      "sweep base_health must be dict(metric=SUMMARY_KEY, floor=NUMBER[, arm=ARM whose "
      f"evaluation of the shared start is checked, default the baseline]), got {base_health!r}"
    )
  extra = {} if base_health is None else {"base_health": ml_collections.ConfigDict(base_health)}
  if engaged is not None:
    keys = set(engaged)
    if (
      not {"text", "arm", "metric"} <= keys
      or len(keys & {"above", "versus_metric"}) != 1
      or keys - {"text", "arm", "metric", "above", "versus_metric", "after_runs"}
      or engaged["arm"] not in arms
    ):
      raise ValueError(
        "sweep engaged must be dict(text=..., arm=ARM, metric=SUMMARY_KEY, and above=NUMBER "
        f"or versus_metric=SUMMARY_KEY[, after_runs=True]), got {engaged!r}"
      )
    extra["engaged"] = ml_collections.ConfigDict(engaged)
  return ml_collections.ConfigDict(
    dict(
      **extra,
      title=title,
      arms=arms,
      baseline=baseline,
      shared_stages=tuple(shared_stages),
      metrics=tuple(metrics),
      curves=tuple(curves),
      notes=tuple(notes),
      program=program,
      clock_metrics=clock_metrics,
      claim=ml_collections.ConfigDict(dict(claim)),
    )
  )
