"""Hysteretic PPO: HPO and A-HPO (arXiv 2605.30201; methods_B §9), with A-HPO's β helpers
(also used by ``controllers.a_hpo``).

Shapes and the loss signature as in :mod:`~posttrain_jax.objectives.ppo_family`; both losses
are PPO-clip (``ppo_family.ppo_clip``) with per-token hysteretic weights.
"""

from typing import Callable

import chex
import jax
import jax.numpy as jnp

from posttrain_jax.objectives import reductions
from posttrain_jax.objectives.ppo_family import ppo_clip


def _response_sign_counts(advantages, mask):
  """(N_+, N_-): responses with a positive / negative (mask-weighted) advantage."""
  if advantages.ndim == 1:
    score = advantages
  else:
    score = jnp.sum(jnp.where(mask > 0, advantages * mask, 0.0), axis=-1)
  has_tokens = jnp.sum(mask, axis=-1) > 0
  n_pos = jnp.sum((score > 0) & has_tokens).astype(jnp.float32)
  n_neg = jnp.sum((score < 0) & has_tokens).astype(jnp.float32)
  return n_pos, n_neg


def a_hpo_beta(
  advantages: jax.Array, mask: jax.Array, *, beta_min: float = 0.05, rule: str = "ratio"
):
  """A-HPO's adaptive negative weight β from batch advantage signs (arXiv 2605.30201).

  [derived, methods_B §9] With N_± the number of responses whose advantage is positive /
  negative (for ``[B, T]`` advantages: the sign of Σ_t m_t A_t):

      rule="ratio":     β = clip(N_+ / N_-, β_min, 1)            (balances Σ|w_i| by sign)
      rule="fraction":  β = clip(N_+ / (N_+ + N_-), β_min, 1)

  N_- = 0 gives β = 1 (no negative term to weigh). β is stop-gradient.

  Args:
    advantages: [B] or [B, T] float32.
    mask: [B, T] float32 completion mask (rows without tokens are not counted).
    beta_min: lower bound β_min (ours: 0.05).
    rule: "ratio" or "fraction".

  Returns:
    (β scalar, metrics with ``hpo/n_pos``, ``hpo/n_neg``, ``hpo/beta``).
  """
  chex.assert_rank(mask, 2)
  advantages = jax.lax.stop_gradient(advantages)
  n_pos, n_neg = _response_sign_counts(advantages, mask)
  beta = beta_from_counts(n_pos, n_neg, beta_min=beta_min, rule=rule)
  return beta, {"hpo/n_pos": n_pos, "hpo/n_neg": n_neg, "hpo/beta": beta}


def beta_from_counts(
  n_pos: jax.Array, n_neg: jax.Array, *, beta_min: float = 0.05, rule: str = "ratio"
) -> jax.Array:
  """A-HPO's β from scalar sign counts N_+, N_- (see ``a_hpo_beta``); 1 when N_- = 0."""
  if rule == "ratio":
    raw = n_pos / jnp.maximum(n_neg, 1e-8)
  elif rule == "fraction":
    raw = n_pos / jnp.maximum(n_pos + n_neg, 1e-8)
  else:
    raise ValueError(f"unknown A-HPO rule {rule!r}; valid: fraction, ratio")
  return jnp.where(n_neg > 0, jnp.clip(raw, beta_min, 1.0), 1.0)


def _group_length_weights(group, mask, num_groups):
  """Per-row factor n_rows / (n_groups · Ltot_p), ``[B, 1]``: under ``seq_mean_token_sum``
  (Σ ℓ f / n_rows) it gives (1/n_groups) Σ_p Σ_{i∈p,t} ℓ / Ltot_p, Ltot_p = G_p · L̄_p."""
  chex.assert_shape(group, (mask.shape[0],))
  chex.assert_type(group, int)
  rows_tokens = jnp.sum(mask, axis=-1)  # [B]
  group_tokens = jax.ops.segment_sum(rows_tokens, group, num_segments=num_groups)  # [P]
  n_rows = jnp.sum(rows_tokens > 0).astype(jnp.float32)
  n_groups = jnp.sum(group_tokens > 0).astype(jnp.float32)
  scale = n_rows / jnp.maximum(n_groups, 1.0)
  return (scale / jnp.maximum(group_tokens[group], 1.0))[:, None]


def hpo(
  logprobs: jax.Array,
  old_logprobs: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  beta: float | jax.Array = 0.5,
  clip_low: float = 0.2,
  clip_high: float = 0.2,
  group: jax.Array | None = None,
  num_groups: int | None = None,
  aggregation: str = "token_mean",
  norm_length=None,
  weights: jax.Array | None = None,
):
  """HPO, hysteretic policy optimisation (arXiv 2605.30201; methods_B §9, partly derived).

      w_t = 1 if A_t > 0 else β            (0 ≤ β ≤ 1; hysteretic, as in hysteretic Q-learning)
      ℓ_t = -w_t · min(ρ_t A_t, clip(ρ_t, 1 - ε_low, 1 + ε_high) A_t)
      L   = (1/(G · L̄)) Σ_i Σ_t m_t ℓ_t                            L̄ = mean_i L_i

  Mean-length normalisation [derived]: with ``group=None`` L̄ is the batch mean length, and
  1/(B·L̄) = 1/Σ m is exactly ``aggregation="token_mean"`` (the default; other aggregations are
  honoured as given, e.g. ``seq_mean_token_mean`` with β=1 is GRPO). With ``group`` (prompt
  index per row, as in ``AdvantageInputs.group``) L̄_p is each group's mean length and
  L = (1/P) Σ_p (1/(G_p L̄_p)) Σ_{i∈p} Σ_t m ℓ over the P groups present; this needs whole
  groups in the (mini)batch and ``aggregation="token_mean"``. In both modes every token of a
  group weighs the same, regardless of its own response's length. β default 0.5 is ours.

  Args:
    logprobs, old_logprobs, advantages, mask: as in ``ppo_clip``.
    beta: weight of negative-advantage tokens (python float or scalar array, stop-gradient).
    clip_low, clip_high: PPO ε_low, ε_high.
    group: optional [B] int32 prompt index for group-mean-length normalisation.
    num_groups: static number of group ids (required with ``group``).
    aggregation, norm_length, weights: as in ``ppo_clip``.

  Returns:
    (scalar loss, metrics).
  """
  chex.assert_rank(mask, 2)
  adv = advantages if advantages.ndim == 2 else advantages[:, None]
  adv = jax.lax.stop_gradient(adv)
  beta = jax.lax.stop_gradient(jnp.asarray(beta, jnp.float32))
  chex.assert_rank(beta, 0)
  hyst = jnp.broadcast_to(jnp.where(adv < 0, beta, 1.0), mask.shape)
  if group is not None:
    if aggregation != "token_mean" or num_groups is None:
      raise ValueError(
        "hpo with group needs num_groups and aggregation='token_mean' "
        "(group-mean-length normalisation replaces the aggregation)"
      )
    hyst = hyst * _group_length_weights(group, mask, num_groups)
    aggregation = "seq_mean_token_sum"
  total = hyst if weights is None else hyst * weights
  loss, metrics = ppo_clip(
    logprobs,
    old_logprobs,
    advantages,
    mask,
    clip_low=clip_low,
    clip_high=clip_high,
    aggregation=aggregation,
    norm_length=norm_length,
    weights=total,
  )
  metrics["hpo/beta"] = beta
  metrics["hpo/neg_token_frac"] = reductions.masked_mean(
    jnp.broadcast_to(adv < 0, mask.shape).astype(jnp.float32), mask
  )
  return loss, metrics


def a_hpo(
  logprobs: jax.Array,
  old_logprobs: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  beta_min: float = 0.05,
  rule: str = "ratio",
  clip_low: float = 0.2,
  clip_high: float = 0.2,
  group: jax.Array | None = None,
  num_groups: int | None = None,
  aggregation: str = "token_mean",
  norm_length=None,
  weights: jax.Array | None = None,
):
  """A-HPO: ``hpo`` with β = ``a_hpo_beta(advantages, mask)`` of this (mini)batch.

  [derived] β = clip(N_+ / N_-, β_min, 1) (or N_+/(N_+ + N_-) with ``rule="fraction"``).
  β is computed from the advantages given here; to use the full batch's β with minibatches,
  compute ``a_hpo_beta`` (or the ``a_hpo`` controller) once and call ``hpo(beta=...)``.
  Args and returns as in ``hpo``; metrics add ``hpo/n_pos`` and ``hpo/n_neg``.
  """
  beta, beta_metrics = a_hpo_beta(advantages, mask, beta_min=beta_min, rule=rule)
  loss, metrics = hpo(
    logprobs,
    old_logprobs,
    advantages,
    mask,
    beta=beta,
    clip_low=clip_low,
    clip_high=clip_high,
    group=group,
    num_groups=num_groups,
    aggregation=aggregation,
    norm_length=norm_length,
    weights=weights,
  )
  metrics.update(beta_metrics)
  return loss, metrics


POLICY_LOSSES: dict[str, Callable] = {"hpo": hpo, "a_hpo": a_hpo}
