"""What every advantage estimator reads, and the helpers they share.

Shapes: ``B`` sequences (``P`` prompts × up to ``G`` rollouts each), ``T`` completion tokens.
Each estimator is a pure function of explicit arrays (e.g. ``group_baselines.grpo``). A registry
of advantages maps a config name to an adapter with one signature::

    fn(inputs: AdvantageInputs, *, num_groups: int, **hparams)
        -> (advantages [B] or [B, T] f32, metrics dict)

``group[b]`` is the prompt index of sequence ``b`` (``0 <= group < num_groups``) and ``valid``
masks padding rows, so variable group sizes run through one compiled shape: a padded row has
``valid = 0``, does not enter any group statistic and gets advantage 0.

Here: :class:`AdvantageInputs`, :class:`GroupStats` (per-group count, mean and std), the shape
checks, the metric helpers and the adapter helpers (:func:`_token_mask`, :func:`_require`) of
the estimators in ``group_baselines``, ``pass_at_k_family``, ``distillation`` and ``value``.
"""

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from posttrain_jax.objectives.reductions import masked_mean, masked_var


class AdvantageInputs(NamedTuple):
  """Everything an advantage estimator may read. Optional fields are None when not computed.

  Attributes:
    rewards: [B] float32 sequence rewards.
    group: [B] int32 prompt index of each sequence.
    valid: [B] float32, 1 for a real rollout, 0 for a padding row.
    mask: [B, T] float32 completion mask.
    logprobs: [B, T] float32 behaviour (sampler / student) log-probs of the sampled tokens.
    teacher_logprobs: [B, T] float32 teacher log-probs of the same tokens (distillation).
    values: [B, T] float32 critic values (GAE).
    baseline_rewards: [B] float32 reward of a baseline rollout per sequence (ReMax greedy).
    token_rewards: [B, T] float32 per-token rewards (the sequence reward on the last token,
      minus the per-token KL when it is shaped into the reward); token-level estimators.
    milestones: [B, T] int32 Numca state keys (the numbers completed so far; -1 before).
    hidden: [B, T, D] float32 the policy's last-layer hidden state before each completion
      token (Hista).
  """

  rewards: jax.Array
  group: jax.Array
  valid: jax.Array
  mask: jax.Array | None = None
  logprobs: jax.Array | None = None
  teacher_logprobs: jax.Array | None = None
  values: jax.Array | None = None
  baseline_rewards: jax.Array | None = None
  token_rewards: jax.Array | None = None
  milestones: jax.Array | None = None
  hidden: jax.Array | None = None


class GroupStats:
  """Per-group count ``[P]``, mean ``[P]`` and Bessel-corrected std ``[P]`` of valid rows, and
  ``flat`` ``[P]``: every valid row of the group has the same reward.

  A flat group's mean is its reward exactly (the float32 sum divided by the count can be one
  rounding step off, e.g. three rewards of 7.3), so its centred rewards and std are exactly 0
  and every estimator built on them gives it exactly zero advantage."""

  def __init__(self, rewards: jax.Array, group: jax.Array, valid: jax.Array, num_groups: int):
    seg = lambda x: jax.ops.segment_sum(x, group, num_segments=num_groups)
    on = valid > 0
    hi = jax.ops.segment_max(jnp.where(on, rewards, -jnp.inf), group, num_segments=num_groups)
    lo = jax.ops.segment_min(jnp.where(on, rewards, jnp.inf), group, num_segments=num_groups)
    self.count = seg(valid)  # [P]
    self.flat = (hi == lo) & (self.count > 0)  # [P]
    mean = seg(rewards * valid) / jnp.maximum(self.count, 1.0)
    self.mean = jnp.where(self.flat, hi, mean)  # [P]
    centred = (rewards - self.mean[group]) * valid
    self.sq = seg(jnp.square(centred))  # [P]
    self.std = jnp.sqrt(self.sq / jnp.maximum(self.count - 1.0, 1.0))  # [P]


# ---------------------------------------------------------------------------------------------
# Shape checks and metrics shared by the estimators.


def _check_rows(*arrays):
  """rewards-like [B] float, group [B] int, valid [B] float (in that order, more floats after)."""
  chex.assert_rank(list(arrays), 1)
  chex.assert_equal_shape(list(arrays))
  chex.assert_type(list(arrays), [float, int, float] + [float] * (len(arrays) - 3))


def _check_tokens(*arrays):
  chex.assert_rank(list(arrays), 2)
  chex.assert_equal_shape(list(arrays))
  chex.assert_type(list(arrays), float)


def _row_metrics(adv: jax.Array, weight: jax.Array) -> dict:
  """Mean, |mean|, std, min and max of ``adv`` over entries with ``weight > 0``."""
  ok = weight > 0
  some = jnp.any(ok)
  return {
    "adv/mean": masked_mean(adv, weight),
    "adv/abs_mean": masked_mean(jnp.abs(adv), weight),
    "adv/std": jnp.sqrt(masked_var(adv, weight)),
    "adv/max": jnp.where(some, jnp.max(jnp.where(ok, adv, -jnp.inf)), 0.0),
    "adv/min": jnp.where(some, jnp.min(jnp.where(ok, adv, jnp.inf)), 0.0),
  }


def _group_metrics(adv, valid, group, num_groups: int, enough_rows: int, name: str):
  """Row metrics plus the fraction of real groups with fewer than ``enough_rows`` valid rows."""
  metrics = _row_metrics(adv, valid)
  counts = jax.ops.segment_sum(valid, group, num_segments=num_groups)
  real = counts > 0
  small = jnp.sum(real & (counts < enough_rows)) / jnp.maximum(jnp.sum(real), 1)
  metrics[f"adv/{name}_small_groups"] = small.astype(jnp.float32)
  return metrics


# ---------------------------------------------------------------------------------------------
# Helpers of the registry adapters.


def _token_mask(inputs: AdvantageInputs, name: str) -> jax.Array:
  if inputs.mask is None:
    raise ValueError(f"advantage {name!r} needs AdvantageInputs.mask [B, T]")
  return inputs.mask * inputs.valid[:, None]


def _require(inputs: AdvantageInputs, field: str, name: str, what: str):
  value = getattr(inputs, field)
  if value is None:
    raise ValueError(f"advantage {name!r} needs AdvantageInputs.{field} ({what}); it is None")
  return value
