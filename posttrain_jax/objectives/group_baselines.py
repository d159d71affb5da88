"""Group and batch baselines for sequence rewards: GRPO, Dr.GRPO, RLOO, OPO, GPG, REINFORCE++
(sequence, token and group-baseline forms) and ReMax.

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
from posttrain_jax.objectives.reductions import (
  WHITENINGS,
  masked_mean,
  masked_var,
  masked_whiten,
  safe_divide,
)
from posttrain_jax.registry import adapts, choices, reads

# ---------------------------------------------------------------------------------------------
# GRPO and Dr.GRPO: the group mean (and std) as baseline.


STD_OVER = ("group", "batch")


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
  std_over: str = "group",
):
  """Group-relative advantage (GRPO; Shao et al. 2024, DeepSeekMath eq. 3).

      A_i = (r_i - mean_{j∈g(i)} r_j) / (std_{j∈g(i)} r_j + eps)

  with the unbiased (n-1) group std, as TRL and verl compute it. With ``normalize_std=False``
  it is the plain group-centred reward used by Dr.GRPO (Liu et al. 2025). ``std_over="batch"``
  divides by the std of every valid reward of the batch instead (the mean stays the group's:
  TRL's ``scale_rewards="batch"``, whose eps is 1e-4).

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
  if std_over not in STD_OVER:
    raise ValueError(f"unknown std_over {std_over!r}; valid: {', '.join(STD_OVER)}")
  if normalize_std:
    batch_std = jnp.sqrt(masked_var(rewards, valid, ddof=1))
    std = stats.std[group] if std_over == "group" else batch_std
    adv = safe_divide(adv, std + eps)
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


@choices(std_over=STD_OVER)
@adapts(grpo)
def _grpo_entry(
  inputs: AdvantageInputs,
  *,
  num_groups: int,
  normalize_std: bool = True,
  eps: float = 1e-6,
  std_over: str = "group",
):
  return grpo(
    inputs.rewards,
    inputs.group,
    inputs.valid,
    num_groups=num_groups,
    normalize_std=normalize_std,
    eps=eps,
    std_over=std_over,
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


def opo(
  rewards: jax.Array, group: jax.Array, valid: jax.Array, lengths: jax.Array, *, num_groups: int
):
  """OPO, on-policy RL with the optimal reward baseline (Hao et al. 2025, arXiv 2505.23585,
  eq. 5): the length-weighted group mean as baseline,

      b_g = Σ_{j∈g} l_j r_j / Σ_{j∈g} l_j,      A_i = r_i - b_{g(i)}

  (the variance-minimising baseline when a response's squared gradient norm grows with its
  length l). Equal lengths give Dr.GRPO's advantage. A group with one valid row gets 0 (its own
  reward is its baseline; verl uses a baseline of 0 there, so such a row gets its raw reward).

  Args:
    rewards: [B] float32; group: [B] int32; valid: [B] float32 (as :func:`rloo`).
    lengths: [B] float32 completion token counts.
    num_groups: static ``P``.

  Returns:
    ([B] advantages, metrics). Σ_{i∈g} l_i A_i = 0 in every group; shift-invariant.
  """
  _check_rows(rewards, group, valid, lengths)
  stats = GroupStats(rewards, group, valid, num_groups)
  w = lengths * valid
  seg = lambda x: jax.ops.segment_sum(x, group, num_segments=num_groups)
  weighted = safe_divide(seg(w * rewards), seg(w))
  base = jnp.where(stats.flat | (seg(w) <= 0), stats.mean, weighted)  # exact for flat groups
  adv = jnp.where((valid > 0) & (stats.count[group] > 1), rewards - base[group], 0.0)
  return adv, _group_metrics(adv, valid, group, num_groups, 2, "opo")


GPG_ALPHAS = ("paper", "nonzero_rewards")


def gpg(
  rewards: jax.Array,
  group: jax.Array,
  valid: jax.Array,
  *,
  num_groups: int,
  normalize_std: bool = False,
  eps: float = 1e-6,
  alpha: str = "paper",
):
  """GPG, group policy gradient (Chu et al. 2025, arXiv 2504.02546, eqs. 9-10): the group-
  centred reward rescaled for the rows that carry no gradient,

      A_i = α (r_i - mean_{g(i)} r) / F,     α = B / (B - M)

  ``B`` valid rows, ``M`` of them in flat groups (every reward equal, one-row groups included:
  their advantage is 0, so the batch mean gradient is rescaled to the rows that have one). ``F``
  is 1, or the group std + eps with ``normalize_std`` (the paper's F_norm option). Paired with
  the plain policy gradient (``policy_loss="reinforce"``) as the paper trains. Convention:
  ``alpha="nonzero_rewards"`` is verl's α = B / #{i: r_i ≠ 0}, which coincides with the
  paper's only when every non-flat row has a non-zero reward.

  Args:
    rewards: [B] float32; group: [B] int32; valid: [B] float32 (as :func:`rloo`).
    num_groups: static ``P``.
    normalize_std: divide by the (unbiased) group std + eps.
    eps: added to the std.
    alpha: ``"paper"`` or ``"nonzero_rewards"``.

  Returns:
    ([B] advantages, metrics with ``adv/gpg_alpha``). Sums to 0 within every group.
  """
  if alpha not in GPG_ALPHAS:
    raise ValueError(f"unknown GPG alpha {alpha!r}; valid: {', '.join(GPG_ALPHAS)}")
  _check_rows(rewards, group, valid)
  stats = GroupStats(rewards, group, valid, num_groups)
  n = jnp.sum(valid)
  if alpha == "paper":
    carrying = jnp.sum(jnp.where(stats.flat[group], 0.0, valid))
  else:
    carrying = jnp.sum(jnp.where(rewards != 0, valid, 0.0))
  scale = n / jnp.maximum(carrying, 1.0)
  adv = rewards - stats.mean[group]
  if normalize_std:
    adv = safe_divide(adv, stats.std[group] + eps)
  adv = jnp.where(valid > 0, scale * adv, 0.0)
  metrics = _group_metrics(adv, valid, group, num_groups, 2, "gpg")
  metrics["adv/gpg_alpha"] = scale
  return adv, metrics


WEIGHINGS = ("rows", "tokens")


def _batch_weights(valid, lengths, weigh: str):
  """Row weights of REINFORCE++'s batch statistics: 1 per valid row (``rows``) or its token
  count (``tokens``: the statistics of the token tile, as verl computes them)."""
  if weigh == "rows":
    return valid
  if weigh != "tokens":
    raise ValueError(f"unknown weighing {weigh!r}; valid: {', '.join(WEIGHINGS)}")
  if lengths is None:
    raise ValueError("weigh='tokens' needs the rows' token counts (lengths [B])")
  chex.assert_equal_shape([valid, lengths])
  return valid * lengths


def reinforce_pp(
  rewards: jax.Array,
  valid: jax.Array,
  *,
  eps: float = 1e-8,
  whitening: str = "population",
  lengths: jax.Array | None = None,
  weigh: str = "rows",
):
  """REINFORCE++ advantage (Hu 2025, "REINFORCE++", sequence-reward form): batch whitening.

      A_i = (r_i - mean_batch r) / scale_batch r

  mean and scale over the valid rows of the whole batch, no per-prompt baseline. The paper's
  per-token KL-in-reward shaping is left to the KL loss terms. Conventions (docs/reference.md):
  ``weigh="rows"`` (default) weighs every row once; ``weigh="tokens"`` weighs a row by its
  ``lengths`` (verl whitens the reward tiled over the tokens, so long rows weigh more);
  ``whitening`` as in ``reductions.masked_whiten`` (``"unbiased"``: verl's).

  Args:
    rewards: [B] float32 sequence rewards.
    valid: [B] float32 row mask.
    eps: added to the scale (inside the square root with ``whitening="unbiased"``).
    whitening: ``"population"`` or ``"unbiased"``.
    lengths: [B] float32 completion token counts (needed with ``weigh="tokens"``).
    weigh: ``"rows"`` or ``"tokens"``.

  Returns:
    ([B] advantages, metrics). Invariant to a shift and a positive scale of the rewards.
  """
  chex.assert_rank([rewards, valid], 1)
  chex.assert_equal_shape([rewards, valid])
  chex.assert_type([rewards, valid], float)
  weights = _batch_weights(valid, lengths, weigh)
  adv = masked_whiten(rewards, weights, eps=eps, whitening=whitening)
  return adv, _row_metrics(adv, valid)


def reinforce_pp_token(
  token_rewards: jax.Array,
  mask: jax.Array,
  *,
  gamma: float = 1.0,
  eps: float = 1e-8,
  whitening: str = "population",
):
  """REINFORCE++ token advantage (Hu 2025, "REINFORCE++", sections 3.1-3.2): the return to go
  of the per-token rewards (the task reward on the last token, ``-β k1_t`` KL shaping at every
  token), whitened over all masked tokens of the batch:

      G_t = Σ_{s >= t} γ^{s-t} r_s,     A_t = (G_t - mean G) / (std G + eps)

  With no KL shaping (and γ = 1) every token of a row has its sequence reward as return, so
  this is :func:`reinforce_pp` with token-weighted batch statistics.

  Args:
    token_rewards: [B, T] float32. mask: [B, T] float32 (completion mask times valid).
    gamma: discount γ. eps: added to the scale.
    whitening: ``"population"`` or ``"unbiased"`` (verl's; ``reductions.masked_whiten``).

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
  adv = masked_whiten(jnp.where(on, returns.T, 0.0), mask, eps=eps, whitening=whitening)
  return adv, _row_metrics(adv, mask)


def reinforce_pp_baseline(
  rewards: jax.Array,
  group: jax.Array,
  valid: jax.Array,
  *,
  num_groups: int,
  eps: float = 1e-8,
  whitening: str = "population",
  lengths: jax.Array | None = None,
  weigh: str = "rows",
):
  """REINFORCE++-baseline (Hu 2025): group mean baseline, then batch-global whitening.

      a_i = r_i - mean_{j∈g(i)} r_j;    A_i = (a_i - mean_batch a) / scale_batch a

  A group with one valid row gets a_i = 0 (verl centres it on 0 instead, so its raw reward
  enters the whitening). ``whitening`` and ``weigh`` as in :func:`reinforce_pp`.

  Args:
    rewards: [B] float32; group: [B] int32; valid: [B] float32 (as :func:`rloo`).
    num_groups: static ``P``.
    eps: added to the batch scale.
    whitening, lengths, weigh: the conventions of :func:`reinforce_pp`.

  Returns:
    ([B] advantages, metrics). Shift- and positive-scale-invariant.
  """
  _check_rows(rewards, group, valid)
  stats = GroupStats(rewards, group, valid, num_groups)
  centred = (rewards - stats.mean[group]) * valid
  weights = _batch_weights(valid, lengths, weigh)
  adv = masked_whiten(centred, weights, eps=eps, whitening=whitening)
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


def _lengths(inputs, weigh: str, name: str):
  return None if weigh == "rows" else jnp.sum(_token_mask(inputs, name), axis=-1)


@choices(whitening=WHITENINGS, weigh=WEIGHINGS)
@adapts(reinforce_pp, fills=("lengths",))
def _reinforce_pp_entry(inputs, *, num_groups, eps=1e-8, whitening="population", weigh="rows"):
  del num_groups
  lengths = _lengths(inputs, weigh, "reinforce_pp")
  return reinforce_pp(
    inputs.rewards, inputs.valid, eps=eps, whitening=whitening, lengths=lengths, weigh=weigh
  )


@choices(whitening=WHITENINGS, weigh=WEIGHINGS)
@adapts(reinforce_pp_baseline, fills=("lengths",))
def _reinforce_pp_baseline_entry(
  inputs, *, num_groups, eps=1e-8, whitening="population", weigh="rows"
):
  return reinforce_pp_baseline(
    inputs.rewards,
    inputs.group,
    inputs.valid,
    num_groups=num_groups,
    eps=eps,
    whitening=whitening,
    lengths=_lengths(inputs, weigh, "reinforce_pp_baseline"),
    weigh=weigh,
  )


@adapts(opo, fills=("lengths",))
def _opo_entry(inputs, *, num_groups):
  lengths = jnp.sum(_token_mask(inputs, "opo"), axis=-1)
  return opo(inputs.rewards, inputs.group, inputs.valid, lengths, num_groups=num_groups)


@choices(alpha=GPG_ALPHAS)
@adapts(gpg)
def _gpg_entry(inputs, *, num_groups, normalize_std=False, eps=1e-6, alpha="paper"):
  return gpg(
    inputs.rewards,
    inputs.group,
    inputs.valid,
    num_groups=num_groups,
    normalize_std=normalize_std,
    eps=eps,
    alpha=alpha,
  )


@reads("baseline_rewards")
@adapts(remax)
def _remax_entry(inputs, *, num_groups):
  del num_groups
  base = _require(inputs, "baseline_rewards", "remax", "[B] reward of the greedy rollout")
  return remax(inputs.rewards, base, inputs.valid)


@reads("token_rewards")
@choices(whitening=WHITENINGS)
@adapts(reinforce_pp_token)
def _reinforce_pp_token_entry(inputs, *, num_groups, gamma=1.0, eps=1e-8, whitening="population"):
  del num_groups
  rewards = _require(inputs, "token_rewards", "reinforce_pp_token", "[B, T] token rewards")
  mask = _token_mask(inputs, "reinforce_pp_token")
  return reinforce_pp_token(rewards, mask, gamma=gamma, eps=eps, whitening=whitening)


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
  "opo": _opo_entry,
  "gpg": _gpg_entry,
}
