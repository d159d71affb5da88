"""Covariance-based entropy control: Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism
of Reinforcement Learning for Reasoning Language Models", arXiv 2505.22617, section 5).

Entropy falls when the tokens with a large covariance between their log-probability and their
advantage are pushed further; both losses act on the few tokens of a batch with the largest

    Cov_t = (A_t - mean A) · (log π(y_t) - mean log π)       (means over the batch's tokens)

Clip-Cov takes them out of the gradient, KL-Cov adds a |log-ratio| penalty on them. Shapes and
the loss signature as in :mod:`~posttrain_jax.objectives.ppo_family`.
"""

from typing import Callable

import jax
import jax.numpy as jnp

from posttrain_jax.objectives import reductions
from posttrain_jax.objectives.ppo_family import _finish, _prepare, _ratio_metrics


def token_covariance(logprobs: jax.Array, advantages: jax.Array, mask: jax.Array) -> jax.Array:
  """``[B, T]`` Cov_t = (A_t - Ā)(log π_t - mean log π) over the masked tokens (stop-gradient);
  0 at masked positions. ``advantages`` are ``[B, 1]`` or ``[B, T]``."""
  lp = jax.lax.stop_gradient(jnp.where(mask > 0, logprobs, 0.0))
  adv = jnp.broadcast_to(advantages, mask.shape)
  cov = (adv - reductions.masked_mean(adv, mask)) * (lp - reductions.masked_mean(lp, mask))
  return jnp.where(mask > 0, cov, 0.0)


def top_share(score: jax.Array, eligible: jax.Array, share: float, total: jax.Array):
  """``[B, T]`` bool: the ``max(⌊share · total⌋, 1)`` eligible entries with the largest score
  (fewer when fewer are eligible); ties go to the earlier position. ``total`` may be traced (the
  count is dynamic, the shapes are not)."""
  flat = jnp.where(eligible, score, -jnp.inf).reshape(-1)
  order = jnp.argsort(-flat, stable=True)
  rank = jnp.zeros_like(order).at[order].set(jnp.arange(order.size))
  k = jnp.maximum(jnp.floor(share * total), 1.0)
  return (eligible.reshape(-1) & (rank < k)).reshape(score.shape)


def clip_cov(
  logprobs: jax.Array,
  old_logprobs: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  clip_low: float = 0.2,
  clip_high: float = 0.2,
  clip_cov_ratio: float = 2e-4,
  clip_cov_lb: float = 1.0,
  clip_cov_ub: float = 5.0,
  aggregation: str = "token_mean",
  norm_length=None,
  weights: jax.Array | None = None,
):
  """Clip-Cov (Cui et al. 2025, Alg. 1): PPO-clip whose selected tokens leave the loss,

      ℓ_t = -min(ρ_t A_t, clip(ρ_t, 1 - ε_low, 1 + ε_high) A_t) · (1 - s_t)

  s_t = 1 for ``max(⌊r N⌋, 1)`` tokens (N masked tokens, r = ``clip_cov_ratio``) among those
  with ω_low < Cov_t < ω_high that PPO's clip left unclipped. [derived] The paper and verl draw
  them uniformly at random; the loss signature has no random key, so here the largest
  covariances in the band are taken (the same set whenever the band holds at most ⌊r N⌋
  tokens). Defaults are the paper's / verl's (r = 2e-4, ω = (1, 5), ε = 0.2).

  Args:
    logprobs, old_logprobs, advantages, mask: as in ``ppo_family.ppo_clip``.
    clip_low, clip_high: PPO ε_low, ε_high.
    clip_cov_ratio: share r of the masked tokens taken out.
    clip_cov_lb, clip_cov_ub: the covariance band (ω_low, ω_high).
    aggregation, norm_length, weights: as in ``ppo_family.ppo_clip``.

  Returns:
    (scalar loss, metrics with ``cov/selected_frac``).
  """
  adv, log_ratio = _prepare(logprobs, old_logprobs, advantages, mask)
  ratio = jnp.exp(log_ratio)
  unclipped = -ratio * adv
  clipped = -jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
  by_clip = clipped > unclipped
  cov = token_covariance(logprobs, adv, mask)
  band = (mask > 0) & ~by_clip & (cov > clip_cov_lb) & (cov < clip_cov_ub)
  selected = top_share(cov, band, clip_cov_ratio, jnp.sum(mask))
  token_loss = jnp.where(selected, 0.0, jnp.maximum(unclipped, clipped))
  metrics = _ratio_metrics(ratio, mask, by_clip)
  metrics["cov/selected_frac"] = reductions.masked_mean(selected.astype(jnp.float32), mask)
  return _finish(token_loss, mask, aggregation, norm_length, metrics, weights)


def kl_cov(
  logprobs: jax.Array,
  old_logprobs: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  kl_cov_ratio: float = 2e-4,
  ppo_kl_coef: float = 1.0,
  aggregation: str = "token_mean",
  norm_length=None,
  weights: jax.Array | None = None,
):
  """KL-Cov (Cui et al. 2025, eq. 11): the unclipped surrogate, with a |log-ratio| penalty on
  the tokens of largest covariance,

      ℓ_t = -ρ_t A_t + β |log ρ_t| · s_t

  s_t = 1 for the ``max(⌊k N⌋, 1)`` masked tokens with the largest Cov_t (k =
  ``kl_cov_ratio``, β = ``ppo_kl_coef``). No ratio clip, as in the paper and verl. Defaults
  k = 2e-4 and β = 1 are verl's.

  Args:
    logprobs, old_logprobs, advantages, mask: as in ``ppo_family.ppo_clip``.
    kl_cov_ratio: share k of the masked tokens penalised.
    ppo_kl_coef: β.
    aggregation, norm_length, weights: as in ``ppo_family.ppo_clip``.

  Returns:
    (scalar loss, metrics with ``cov/selected_frac`` and ``kl/abs_old``).
  """
  adv, log_ratio = _prepare(logprobs, old_logprobs, advantages, mask)
  ratio = jnp.exp(log_ratio)
  cov = token_covariance(logprobs, adv, mask)
  selected = top_share(cov, mask > 0, kl_cov_ratio, jnp.sum(mask))
  token_loss = -ratio * adv + jnp.where(selected, ppo_kl_coef * jnp.abs(log_ratio), 0.0)
  metrics = _ratio_metrics(ratio, mask, jnp.zeros(mask.shape, bool))
  del metrics["ratio/clip_frac"]
  metrics["cov/selected_frac"] = reductions.masked_mean(selected.astype(jnp.float32), mask)
  metrics["kl/abs_old"] = reductions.masked_mean(jnp.abs(log_ratio), mask)
  return _finish(token_loss, mask, aggregation, norm_length, metrics, weights)


POLICY_LOSSES: dict[str, Callable] = {"clip_cov": clip_cov, "kl_cov": kl_cov}
