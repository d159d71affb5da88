"""Group and batch baselines for sequence rewards: GRPO, Dr.GRPO, RLOO, REINFORCE++ (sequence,
token and group-baseline forms) and ReMax.

Shapes: ``B`` sequences (``P`` prompt slots × up to ``G`` rollouts), ``T`` completion tokens.
Each estimator is a pure function of explicit arrays; :data:`ADVANTAGES` maps a config name to
an adapter over :class:`~posttrain_jax.objectives.advantage_inputs.AdvantageInputs`::

    fn(inputs: AdvantageInputs, *, num_groups: int, **hparams)
        -> (advantages [B] or [B, T] f32, metrics dict)

Group estimators read ``group [B]`` (prompt slot, any order, need not be contiguous) and
``valid [B]``; a padding row (``valid = 0``) enters no statistic and gets advantage 0, so variable
group sizes run through one compiled shape.
"""

from typing import Callable

import chex
import jax
import jax.numpy as jnp

from posttrain_jax.objectives.advantage_inputs import (
  AdvantageInputs,
  GroupStats,
  _check_rows,
  _check_tokens,
  _group_metrics,
  _require,
  _row_metrics,
  _token_mask,
)
from posttrain_jax.objectives.reductions import masked_mean, masked_whiten, safe_divide
from posttrain_jax.registry import adapts, reads

# ---------------------------------------------------------------------------------------------
# GRPO and Dr.GRPO: the group mean (and std) as baseline.


def _check(rewards, group, valid):
  chex.assert_rank([rewards, group, valid], 1)
  chex.assert_equal_shape([rewards, group, valid])
  chex.assert_type([rewards, group, valid], [float, int, float])


def grpo(
  rewards: jax.Array,
  group: jax.Array,
  valid: jax.Array,
  *,
  num_groups: int,
  normalize_std: bool = True,
  eps: float = 1e-6,
):
  """Group-relative advantage (GRPO; Shao et al. 2024, DeepSeekMath eq. 3).

      A_i = (r_i - mean_{j∈g(i)} r_j) / (std_{j∈g(i)} r_j + eps)

  with the unbiased (n-1) group std, as TRL and verl compute it. With ``normalize_std=False``
  it is the plain group-centred reward used by Dr.GRPO (Liu et al. 2025).

  Args:
    rewards: [B] float32 scalar reward of each sequence.
    group: [B] int32 prompt index of each sequence.
    valid: [B] float32, 1 for a real rollout, 0 for padding.
    num_groups: static number of prompt slots ``P``.
    normalize_std: divide by the group std.
    eps: added to the std.

  Returns:
    ([B] advantages, metrics). Within every group of a real prompt the advantages sum to 0.
  """
  _check(rewards, group, valid)
  stats = GroupStats(rewards, group, valid, num_groups)
  adv = rewards - stats.mean[group]
  if normalize_std:
    adv = safe_divide(adv, stats.std[group] + eps)
  adv = adv * valid
  real = (stats.count > 0).astype(jnp.float32)
  zero_signal = stats.flat.astype(jnp.float32)
  metrics = {
    "adv/mean": jnp.sum(adv) / jnp.maximum(jnp.sum(valid), 1.0),
    "adv/abs_mean": jnp.sum(jnp.abs(adv)) / jnp.maximum(jnp.sum(valid), 1.0),
    "adv/zero_signal_groups": jnp.sum(zero_signal) / jnp.maximum(jnp.sum(real), 1.0),
  }
  return adv, metrics


def dr_grpo(
  rewards: jax.Array, group: jax.Array, valid: jax.Array, *, num_groups: int, eps: float = 1e-6
):
  """Dr.GRPO advantage (Liu et al. 2025, "Understanding R1-Zero-Like Training", eq. 4).

      A_i = r_i - mean_{j∈g(i)} r_j

  No std normalisation (it biases towards too-easy and too-hard prompts). Shapes as :func:`grpo`.
  """
  return grpo(rewards, group, valid, num_groups=num_groups, normalize_std=False, eps=eps)


@adapts(grpo)
def _grpo_entry(
  inputs: AdvantageInputs, *, num_groups: int, normalize_std: bool = True, eps: float = 1e-6
):
  return grpo(
    inputs.rewards,
    inputs.group,
    inputs.valid,
    num_groups=num_groups,
    normalize_std=normalize_std,
    eps=eps,
  )


@adapts(dr_grpo)
def _dr_grpo_entry(inputs: AdvantageInputs, *, num_groups: int, eps: float = 1e-6):
  return dr_grpo(inputs.rewards, inputs.group, inputs.valid, num_groups=num_groups, eps=eps)


# ---------------------------------------------------------------------------------------------
# Reward-level baselines: RLOO, REINFORCE++, ReMax.


def rloo(rewards: jax.Array, group: jax.Array, valid: jax.Array, *, num_groups: int):
  """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics", eq. 5).

      A_i = r_i - 1/(n-1) Σ_{j∈g(i), j≠i} r_j  =  n/(n-1) · (r_i - mean_{g(i)} r)

  over the ``n`` valid rows of the group; a group with a single rollout gets 0.

  Args:
    rewards: [B] float32 sequence rewards.
    group: [B] int32 prompt slot of each row.
    valid: [B] float32, 1 for a real rollout, 0 for padding.
    num_groups: static number of prompt slots ``P``.

  Returns:
    ([B] advantages, metrics). Sums to 0 within every group; invariant to a reward shift.
  """
  _check_rows(rewards, group, valid)
  stats = GroupStats(rewards, group, valid, num_groups)
  n = stats.count[group]
  adv = (rewards - stats.mean[group]) * n / jnp.maximum(n - 1.0, 1.0)
  adv = jnp.where((valid > 0) & (n > 1), adv, 0.0)
  return adv, _group_metrics(adv, valid, group, num_groups, 2, "rloo")


def reinforce_pp(rewards: jax.Array, valid: jax.Array, *, eps: float = 1e-8):
  """REINFORCE++ advantage (Hu 2025, "REINFORCE++", sequence-reward form): batch whitening.

      A_i = (r_i - mean_batch r) / (std_batch r + eps)

  mean and (population) std over the valid rows of the whole batch, no per-prompt baseline. The
  paper's per-token KL-in-reward shaping is left to the KL loss terms.

  Args:
    rewards: [B] float32 sequence rewards.
    valid: [B] float32 row mask.
    eps: added to the std.

  Returns:
    ([B] advantages, metrics). Invariant to a shift and a positive scale of the rewards.
  """
  chex.assert_rank([rewards, valid], 1)
  chex.assert_equal_shape([rewards, valid])
  chex.assert_type([rewards, valid], float)
  adv = masked_whiten(rewards, valid, eps=eps)
  return adv, _row_metrics(adv, valid)


def reinforce_pp_token(
  token_rewards: jax.Array, mask: jax.Array, *, gamma: float = 1.0, eps: float = 1e-8
):
  """REINFORCE++ token advantage (Hu 2025, "REINFORCE++", sections 3.1-3.2): the return to go
  of the per-token rewards (the task reward on the last token, ``-β k1_t`` KL shaping at every
  token), whitened over all masked tokens of the batch:

      G_t = Σ_{s >= t} γ^{s-t} r_s,     A_t = (G_t - mean G) / (std G + eps)

  With no KL shaping (and γ = 1) every token of a row has its sequence reward as return, so
  this is :func:`reinforce_pp` with token-weighted batch statistics.

  Args:
    token_rewards: [B, T] float32. mask: [B, T] float32 (completion mask times valid).
    gamma: discount γ. eps: added to the std.

  Returns:
    ([B, T] advantages, 0 where ``mask = 0``, metrics).
  """
  _check_tokens(token_rewards, mask)
  on = mask > 0
  r = jnp.where(on, token_rewards, 0.0)

  def step(carry, r_t):
    carry = r_t + gamma * carry
    return carry, carry

  _, returns = jax.lax.scan(step, jnp.zeros(r.shape[:1], jnp.float32), r.T, reverse=True)
  adv = masked_whiten(jnp.where(on, returns.T, 0.0), mask, eps=eps)
  return adv, _row_metrics(adv, mask)


def reinforce_pp_baseline(
  rewards: jax.Array, group: jax.Array, valid: jax.Array, *, num_groups: int, eps: float = 1e-8
):
  """REINFORCE++-baseline (Hu 2025): group mean baseline, then batch-global whitening.

      a_i = r_i - mean_{j∈g(i)} r_j;    A_i = (a_i - mean_batch a) / (std_batch a + eps)

  Args:
    rewards: [B] float32; group: [B] int32; valid: [B] float32 (as :func:`rloo`).
    num_groups: static ``P``.
    eps: added to the batch std.

  Returns:
    ([B] advantages, metrics). Shift- and positive-scale-invariant.
  """
  _check_rows(rewards, group, valid)
  stats = GroupStats(rewards, group, valid, num_groups)
  centred = (rewards - stats.mean[group]) * valid
  adv = masked_whiten(centred, valid, eps=eps)
  return adv, _row_metrics(adv, valid)


def remax(rewards: jax.Array, baseline_rewards: jax.Array, valid: jax.Array):
  """ReMax (Li et al. 2023, "ReMax", Alg. 1): the greedy rollout's reward is the baseline.

      A_i = r(x, y_i) - r(x, ŷ_greedy(x))

  Args:
    rewards: [B] float32 sampled-rollout rewards.
    baseline_rewards: [B] float32 reward of the greedy rollout of the same prompt.
    valid: [B] float32 row mask.

  Returns:
    ([B] advantages, metrics).
  """
  chex.assert_rank([rewards, baseline_rewards, valid], 1)
  chex.assert_equal_shape([rewards, baseline_rewards, valid])
  chex.assert_type([rewards, baseline_rewards, valid], float)
  adv = jnp.where(valid > 0, rewards - baseline_rewards, 0.0)
  metrics = _row_metrics(adv, valid)
  metrics["adv/baseline_mean"] = masked_mean(baseline_rewards, valid)
  return adv, metrics


# ---------------------------------------------------------------------------------------------
# Registry adapters.


@adapts(rloo)
def _rloo_entry(inputs, *, num_groups):
  return rloo(inputs.rewards, inputs.group, inputs.valid, num_groups=num_groups)


@adapts(reinforce_pp)
def _reinforce_pp_entry(inputs, *, num_groups, eps=1e-8):
  del num_groups
  return reinforce_pp(inputs.rewards, inputs.valid, eps=eps)


@adapts(reinforce_pp_baseline)
def _reinforce_pp_baseline_entry(inputs, *, num_groups, eps=1e-8):
  return reinforce_pp_baseline(
    inputs.rewards, inputs.group, inputs.valid, num_groups=num_groups, eps=eps
  )


@reads("baseline_rewards")
@adapts(remax)
def _remax_entry(inputs, *, num_groups):
  del num_groups
  base = _require(inputs, "baseline_rewards", "remax", "[B] reward of the greedy rollout")
  return remax(inputs.rewards, base, inputs.valid)


@reads("token_rewards")
@adapts(reinforce_pp_token)
def _reinforce_pp_token_entry(inputs, *, num_groups, gamma=1.0, eps=1e-8):
  del num_groups
  rewards = _require(inputs, "token_rewards", "reinforce_pp_token", "[B, T] token rewards")
  mask = _token_mask(inputs, "reinforce_pp_token")
  return reinforce_pp_token(rewards, mask, gamma=gamma, eps=eps)


# Config name -> adapter over AdvantageInputs. Adding an estimator: a pure function above and
# one adapter + entry here.
ADVANTAGES: dict[str, Callable] = {
  "grpo": _grpo_entry,
  "dr_grpo": _dr_grpo_entry,
  "rloo": _rloo_entry,
  "reinforce_pp": _reinforce_pp_entry,
  "reinforce_pp_baseline": _reinforce_pp_baseline_entry,
  "reinforce_pp_token": _reinforce_pp_token_entry,
  "remax": _remax_entry,
}
