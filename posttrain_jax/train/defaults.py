"""The default experiment config every experiment file starts from (declared in
``train/config_fields/``), the reproductions' shared bases, and ``arg`` parsing.

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


def base_config() -> ml_collections.ConfigDict:
  """Every key the stages read, with its default: built from the declarations of
  ``train/config_fields/`` (each key's default, doc, range and first stage, declared once)."""
  return fields.to_config(config_fields.ROOT)


def complete(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Fills in place every key of :func:`base_config` that ``config`` lacks (its own values
  win; free-form sections such as ``*kwargs`` are not filled). The one place defaults live:
  code after :func:`~posttrain_jax.train.validate.validate` reads keys as attributes."""
  _fill(config, base_config())
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


def sparse_addition_base(seed: int) -> ml_collections.ConfigDict:
  """:func:`addition_base` with pretraining stopped at 450 steps, before or at the start of the
  accuracy jump, so few rollouts are correct when RL starts. The shared base of the hpo,
  maxpo_sparse, rollout_replay, cero and review reproductions (they reuse its checkpoints)."""
  c = addition_base(seed)
  c.pretrain.update(steps=450, eval_every=150, checkpoint_every=150)
  return c


def addition_base(seed: int) -> ml_collections.ConfigDict:
  """The quickstart's setting: 3-digit addition, tiny model, 1,000 pretraining steps on a
  corpus whose answers forget every carry half of the time, then 16 x 8 GRPO. Reproduction
  configs start from it so they can share the quickstart's pretraining checkpoints."""
  c = base_config()
  c.seed = seed
  c.env.name, c.env.level = "arithmetic", 3
  c.model.preset = "tiny"
  c.pretrain.update(steps=1000, batch_size=128, lr=1e-3, corpus_noise=0.5, eval_every=100)
  c.rl.update(
    steps=200, prompts_per_step=16, group_size=8, lr=1e-4, max_new_tokens=6, eval_every=50
  )
  return c


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
) -> ml_collections.ConfigDict:
  """A reproduction's ``config.sweep`` (scripts/reproduce.py): its arms (the first metric is the
  claim's unless ``claim['metric']`` says otherwise), the baseline arm of the paired tests, the
  paper's claim (``text``, ``arm``, ``metric``, ``direction`` 'higher' or 'lower') declared
  before the runs, the stages the arms share per seed, the curves to plot and notes."""
  arms = tuple(arms)
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
  return ml_collections.ConfigDict(
    dict(
      title=title,
      arms=arms,
      baseline=baseline,
      shared_stages=tuple(shared_stages),
      metrics=tuple(metrics),
      curves=tuple(curves),
      notes=tuple(notes),
      claim=ml_collections.ConfigDict(dict(claim)),
    )
  )
