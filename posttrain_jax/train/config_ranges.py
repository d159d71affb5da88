"""The ranges of the config's numeric keys and the settings that have no effect.

:data:`NUMERIC_KEYS` gives every numeric key of ``train/defaults.py`` a kind of :data:`KINDS`
(a positive count, a fraction ...); :func:`check_numbers` refuses a value outside it with a
ConfigError naming the key. :data:`UNUSED_WHEN` lists keys another setting switches off;
:func:`warn_unused` prints a key set away from its default there once, as ``warning: ...``.
"""

import math
import sys

import numpy as np

from posttrain_jax import objectives
from posttrain_jax.registry import ConfigError
from posttrain_jax.train import defaults


def _require(cond: bool, msg: str) -> None:
  if not cond:
    raise ConfigError(msg)


def _is_int(v) -> bool:
  return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_real(v) -> bool:
  return isinstance(v, (int, float, np.number)) and not isinstance(v, bool)


# Kinds of numeric key: (test, the requirement as the message states it, a value it refuses).
KINDS = {
  "count": (lambda v: _is_int(v) and v >= 1, "a positive integer", 0),
  "count0": (lambda v: _is_int(v) and v >= 0, "an integer >= 0", -1),
  "finite": (lambda v: _is_real(v) and math.isfinite(v), "a finite number", float("nan")),
  "positive": (lambda v: _is_real(v) and v > 0, "a number > 0", 0.0),
  "nonneg": (lambda v: _is_real(v) and v >= 0, "a number >= 0", -1.0),
  "fraction": (lambda v: _is_real(v) and 0 <= v <= 1, "a number in [0, 1]", 1.5),
  "prob": (lambda v: _is_real(v) and 0 < v <= 1, "a number in (0, 1]", 0.0),
  "decay": (lambda v: _is_real(v) and 0 <= v < 1, "a number in [0, 1)", 1.0),
  "open": (lambda v: _is_real(v) and 0 < v < 1, "a number in (0, 1)", 1.0),
}

# Every numeric key of train/defaults.py and its kind (tests/faults/test_faults_errors.py
# checks the table covers them all; model.causal_block and distributed.* are checked below).
NUMERIC_KEYS = {
  "seed": "count0",
  "cpu_devices": "count0",
  "model.max_seq_len": "count",
  "distributed.initialization_timeout": "positive",
  **{
    f"pretrain.{k}": v
    for k, v in dict(
      steps="count0",
      batch_size="count",
      lr="positive",
      warmup_steps="count0",
      weight_decay="nonneg",
      grad_clip="nonneg",
      b2="decay",
      corpus_noise="fraction",
      eval_every="count",
      eval_problems="count",
      checkpoint_every="count",
      max_nonfinite_steps="count",
      max_update_ratio="nonneg",
    ).items()
  },
  **{
    f"rl.{k}": v
    for k, v in dict(
      steps="count0",
      prompts_per_step="count",
      group_size="count",
      lr="positive",
      warmup_steps="count0",
      weight_decay="nonneg",
      grad_clip="nonneg",
      b2="decay",
      temperature="positive",
      top_k="count0",
      top_p="prob",
      max_new_tokens="count",
      kl_coef="nonneg",
      entropy_coef="finite",
      epochs="count",
      minibatches="count",
      trim_min_length="count",
      eval_every="count0",
      eval_problems="count",
      checkpoint_every="count",
      max_nonfinite_steps="count",
      staleness="count0",
      kl_target="positive",
      kl_horizon="positive",
      critic_lr="positive",
      critic_updates="count",
      value_clip="positive",
      max_rollouts="count0",
      max_update_ratio="nonneg",
    ).items()
  },
  **{f"rl.dcmdp.{k}": "nonneg" for k in ("delta", "lr", "lam_max", "lam0", "decay")},
  "rl.lora.rank": "count0",
  "rl.lora.alpha": "positive",
  "rl.hpo.beta_min": "prob",
  "rl.hpo.momentum": "decay",
  **{
    f"rl.curriculum.{k}": v
    for k, v in dict(
      up="fraction",
      down="fraction",
      window="count",
      min_count="count",
      ema_decay="open",
      review="decay",
      min_weight="nonneg",
      start="count0",
    ).items()
  },
  "rl.dynamic_sampling.max_rounds": "count",
  **{
    f"rl.teacher.{k}": v
    for k, v in dict(
      pretrain_steps="count0",
      pretrain_noise="fraction",
      temperature="positive",
      pretrain_context="fraction",
      coef="nonneg",
      steps="count0",
      lmbda="fraction",
    ).items()
  },
  **{
    f"rl.save.{k}": v
    for k, v in dict(
      k="nonneg",
      delta="nonneg",
      lr="positive",
      value_coef="nonneg",
      offline_coef="nonneg",
      offline_batch="count",
    ).items()
  },
  **{
    f"rl.denoise.{k}": v
    for k, v in dict(
      fraction="fraction", rho="fraction", tries="count", eval_rho="fraction"
    ).items()
  },
  "rl.async_rollouts.queue_size": "count",
  "rl.async_rollouts.max_staleness": "count0",
  "reward.timeout": "positive",
  "reward.workers": "count0",
  "reward.max_error_rate": "fraction",
  **{
    f"agent.{k}": v
    for k, v in dict(
      max_turns="count",
      max_obs_chars="count",
      max_obs_tokens="count0",
      max_tool_failures="count0",
      tool_timeout_s="positive",
    ).items()
  },
  **{
    f"reward_model.{k}": v
    for k, v in dict(
      pairs="count",
      eval_fraction="decay",
      steps="count0",
      batch_size="count",
      lr="positive",
      warmup_steps="count0",
      weight_decay="nonneg",
      grad_clip="nonneg",
      b2="decay",
      center_coef="nonneg",
      max_len="count0",
      eval_every="count",
      checkpoint_every="count",
      max_nonfinite_steps="count",
      max_update_ratio="nonneg",
    ).items()
  },
  **{
    f"eval.{k}": v
    for k, v in dict(
      num_problems="count",
      batch_size="count",
      pass_k="count",
      pass_n="count",
      pass_problems="count",
      temperature="positive",
      seed="count0",
      heldout_level="count0",
    ).items()
  },
}


def _lookup(config, key: str):
  """``config[a][b]...`` for ``key`` = 'a.b...'; KeyError when a section is None (off)."""
  node = config
  for part in key.split("."):
    if node is None:
      raise KeyError(key)
    node = node[part]
  return node


def check_numbers(config) -> None:
  """Every key of :data:`NUMERIC_KEYS` holds a number of its kind (``rl.norm_length``: None
  or a positive integer)."""
  for key, kind in NUMERIC_KEYS.items():
    ok, need, _ = KINDS[kind]
    try:
      value = _lookup(config, key)
    except KeyError:
      continue  # a section switched off (e.g. rl.curriculum=None)
    _require(ok(value), f"config.{key} must be {need}, got {value!r}")
  norm = config.rl.norm_length
  _require(
    norm is None or KINDS["count"][0](norm),
    f"config.rl.norm_length must be None (the max_new_tokens budget) or a positive "
    f"integer, got {norm!r}",
  )


def _reads_values(c) -> bool:
  return "values" in getattr(objectives.ADVANTAGES.get(c.rl.advantage), "reads", ())


# Keys that have no effect unless another setting selects them: (keys, is unused, why).
UNUSED_WHEN = (
  (
    ("rl.kl_estimator", "rl.kl_in_reward", "rl.kl_controller", "rl.kl_per_token"),
    lambda c: not c.rl.kl_coef,
    "config.rl.kl_coef is 0 (no KL term)",
  ),
  (
    ("rl.kl_target", "rl.kl_horizon"),
    lambda c: c.rl.kl_controller != "adaptive",
    "only config.rl.kl_controller='adaptive' reads them",
  ),
  (
    ("rl.critic_lr", "rl.critic_updates", "rl.value_clip"),
    lambda c: not _reads_values(c),
    "only an advantage that reads critic values (gae) trains a critic",
  ),
  (
    tuple(f"rl.dcmdp.{k}" for k in ("delta", "lr", "lam_max", "lam0", "dead_zone", "decay")),
    lambda c: not c.rl.dcmdp.enabled,
    "config.rl.dcmdp.enabled is False",
  ),
  (
    ("rl.lora.alpha", "rl.lora.targets"),
    lambda c: not (c.rl.lora and c.rl.lora.rank),
    "config.rl.lora.rank is 0 (full fine-tuning)",
  ),
  (
    ("rl.trim_min_length",),
    lambda c: not c.rl.trim_completions,
    "config.rl.trim_completions is False",
  ),
  (
    ("rl.dynamic_sampling.max_rounds",),
    lambda c: not c.rl.dynamic_sampling.enabled,
    "config.rl.dynamic_sampling.enabled is False",
  ),
  (
    ("rl.async_rollouts.queue_size", "rl.async_rollouts.max_staleness"),
    lambda c: not c.rl.async_rollouts.enabled,
    "config.rl.async_rollouts.enabled is False",
  ),
  (
    ("model.preset", "model.max_seq_len"),
    lambda c: bool(c.model.hf_path),
    "config.model.hf_path loads the checkpoint's own architecture and positions",
  ),
  (
    ("eval.heldout_level",),
    lambda c: not c.eval.heldout_env and not tuple(c.eval.extra_envs),
    "config.eval.heldout_env and config.eval.extra_envs are empty",
  ),
  (
    ("rl.teacher.coef", "rl.teacher.steps", "rl.teacher.pg_during", "rl.teacher.lmbda"),
    lambda c: not c.rl.teacher.loss,
    "config.rl.teacher.loss is empty (no distillation term)",
  ),
  (
    (
      "rl.teacher.preset",
      "rl.teacher.overrides",
      "rl.teacher.pretrain_steps",
      "rl.teacher.pretrain_noise",
    ),
    lambda c: c.rl.teacher.source != "stage",
    "only config.rl.teacher.source='stage' trains a teacher of its own",
  ),
  (
    ("reward_model.overrides",),
    lambda c: not c.reward_model.preset,
    "config.reward_model.preset is empty (the reward model is the run's model)",
  ),
  (
    ("reward_model.pairs",),
    lambda c: bool(c.reward_model.data),
    "config.reward_model.data gives the pairs (pairs counts those made from the env)",
  ),
  (
    (
      "agent.tool_kwargs",
      "agent.max_turns",
      "agent.max_obs_chars",
      "agent.max_obs_tokens",
      "agent.max_tool_failures",
      "agent.tool_timeout_s",
      "agent.buckets",
    ),
    lambda c: not tuple(c.agent.tools),
    "config.agent.tools is empty (single-turn rollouts)",
  ),
  (
    (
      "rl.denoise.fraction",
      "rl.denoise.rho",
      "rl.denoise.tries",
      "rl.denoise.boundary",
      "rl.denoise.mask_prefix",
      "rl.denoise.eval_rho",
    ),
    lambda c: not c.rl.denoise.enabled,
    "config.rl.denoise.enabled is False",
  ),
  (
    ("rl.teacher.path",),
    lambda c: c.rl.teacher.source != "path",
    "only config.rl.teacher.source='path' loads a teacher from a folder",
  ),
)
_warned = set()


def _plain(value):
  """A section as a plain dict (two ConfigDicts with the same items may compare unequal)."""
  return value.to_dict() if hasattr(value, "to_dict") else value


def unused_settings(config) -> list[str]:
  """One line per key set away from its default that has no effect under the rest of
  ``config`` (:data:`UNUSED_WHEN`)."""
  base = defaults.base_config()
  out = []
  for keys, unused, why in UNUSED_WHEN:
    if not unused(config):
      continue
    for key in keys:
      try:
        value = _lookup(config, key)
      except KeyError:
        continue
      if _plain(value) != _plain(_lookup(base, key)):
        out.append(f"config.{key}={value!r} has no effect: {why}")
  return out


def warn_unused(config) -> None:
  """Prints each of :func:`unused_settings` once per process, as ``warning: ...`` on stderr."""
  for line in unused_settings(config):
    if line not in _warned:
      _warned.add(line)
      print(f"warning: {line}", file=sys.stderr, flush=True)
