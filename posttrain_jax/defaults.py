"""The default experiment config every experiment file starts from: the engine's sections
(``train/config_fields/``) and every method's (``methods/<name>/fields.py``), each key declared
once with its default, doc, range and first stage; the reproductions' shared bases; and the
helpers experiment files use (``arg`` parsing, arms, smoke runs, the sweep section).

    from posttrain_jax import defaults

    def get_config(arg=None):
      args = defaults.parse_arg(arg, smoke=False, seed=0)
      c = defaults.addition_base(args.seed)
      ...
"""

import ml_collections

from posttrain_jax import fields, methods
from posttrain_jax.train import configs, hooks
from posttrain_jax.train.configs import (
  apply_arm,
  make_smoke,
  parse_arg,
  parse_arm_arg,
  sweep,
)

ROOT = hooks.config_root(methods.METHODS)  # the whole config's declaration
KEYS = fields.flatten(ROOT)  # "rl.save.lr" -> fields.Key


def base_config() -> ml_collections.ConfigDict:
  """Every key of the config with its default (the engine's sections and every method's)."""
  return configs.base_config(ROOT)


def complete(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Fills in place every key ``config`` lacks with its default (:func:`base_config`)."""
  return configs.complete(config, ROOT)


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


def sparse_addition_base(seed: int) -> ml_collections.ConfigDict:
  """:func:`addition_base` with pretraining stopped at 450 steps, before or at the start of the
  accuracy jump, so few rollouts are correct when RL starts. The shared base of the hpo,
  maxpo_sparse, rollout_replay, cero and review reproductions (they reuse its checkpoints)."""
  c = addition_base(seed)
  c.pretrain.update(steps=450, eval_every=150, checkpoint_every=150)
  return c


__all__ = [
  "KEYS",
  "ROOT",
  "addition_base",
  "apply_arm",
  "base_config",
  "complete",
  "make_smoke",
  "parse_arg",
  "parse_arm_arg",
  "sparse_addition_base",
  "sweep",
]
