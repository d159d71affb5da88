"""Sequence-level importance ratios: GSPO, LUSPO, GMPO and VESPO.

Each weighs a whole response by one ratio built from its token log-ratios (their mean, their
sum or their clipped geometric mean) instead of weighing every token by its own. Shapes and the
loss signature as in :mod:`~posttrain_jax.objectives.ppo_family`.
"""

import math
from typing import Callable

import jax
import jax.numpy as jnp

from posttrain_jax.objectives import reductions
from posttrain_jax.objectives.ppo_family import _finish, _prepare, _ratio_metrics

_MAX_LOG_RATIO = 10.0  # GSPO: the sequence log-ratio's upper clamp before exp (verl's value).


def gspo(
  logprobs: jax.Array,
  old_logprobs: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  clip_low: float = 3e-4,
  clip_high: float = 4e-4,
  aggregation: str = "token_mean",
  norm_length=None,
  weights: jax.Array | None = None,
):
  """GSPO, sequence-level importance ratio (Zheng et al. 2025, eqs. 5-7 and GSPO-token, eq. 13).

      log s_i   = (1/|y_i|) Σ_t m_t (log π(y_t) - log π_old(y_t))
      s_{i,t}   = exp( min(sg(log s_i) + log π(y_t) - sg(log π(y_t)), 10) )  (value s_i)
      ℓ_{i,t}   = -min( s_{i,t} A_{i,t}, clip(s_{i,t}, 1 - ε_low, 1 + ε_high) A_{i,t} )

  The clip decision is per sequence; a clipped sequence gives no gradient to any of its tokens,
  nor does a sequence whose log-ratio exceeds the bound 10 (verl's clamp, gradient included).
  With advantages ``[B]`` and ``aggregation="seq_mean_token_mean"`` the gradient equals the
  paper's sequence-level GSPO gradient s_i A_i ∇ log s_i averaged over sequences; under the
  default ``token_mean`` every token gets s_i A_i ∇ log π(y_t) / Σ m (the derivative of
  -Σ_i |y_i| s_i A_i / Σ m). Defaults ε_low = 3e-4, ε_high = 4e-4 are the paper's.

  Args:
    logprobs: [B, T] float32 current log-probs (differentiated).
    old_logprobs: [B, T] float32 behaviour log-probs (stop-gradient).
    advantages: [B] or [B, T] float32 (stop-gradient).
    mask: [B, T] float32 completion mask.
    clip_low, clip_high: ε_low, ε_high on the sequence ratio.
    aggregation, norm_length, weights: as in ``ppo_clip``.

  Returns:
    (scalar loss, metrics).
  """
  adv, log_ratio = _prepare(logprobs, old_logprobs, advantages, mask)
  lengths = jnp.maximum(jnp.sum(mask, axis=-1, keepdims=True), 1.0)
  log_seq = jnp.sum(log_ratio * mask, axis=-1, keepdims=True) / lengths  # [B, 1]
  safe_lp = jnp.where(mask > 0, logprobs, 0.0)
  log_token = jax.lax.stop_gradient(log_seq) + safe_lp - jax.lax.stop_gradient(safe_lp)
  # Above the bound the ratio is the constant e^10: value and gradient clamped, as verl does.
  log_token = jnp.where(log_token > _MAX_LOG_RATIO, _MAX_LOG_RATIO, log_token)
  ratio = jnp.exp(log_token)  # [B, T], value s_i
  unclipped = -ratio * adv
  clipped = -jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
  token_loss = jnp.maximum(unclipped, clipped)
  metrics = _ratio_metrics(ratio, mask, clipped > unclipped)
  metrics["ratio/seq_log_mean"] = jnp.mean(jnp.minimum(log_seq, _MAX_LOG_RATIO))
  return _finish(token_loss, mask, aggregation, norm_length, metrics, weights)


def gmpo(
  logprobs: jax.Array,
  old_logprobs: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  clip_low: float = 0.4,
  clip_high: float = 0.4,
  aggregation: str = "token_mean",
  norm_length=None,
  weights: jax.Array | None = None,
):
  """GMPO, geometric-mean policy optimisation (Zhao et al. 2025, arXiv 2507.20673, eq. 4): the
  sequence objective uses the geometric mean of the token ratios, each clipped in log space,

      c_t = min(log ρ_t, ε_high)  if Ā_i > 0,   max(log ρ_t, -ε_low)  if Ā_i < 0,   0 if Ā_i = 0
      ℓ_i = -Ā_i · exp( (1/|y_i|) Σ_t m_t c_t ),      Ā_i = mean_t A_t over the row's tokens

  A token beyond its bound gives no gradient. Every token of row i carries ℓ_i, so
  ``aggregation="seq_mean_token_mean"`` gives the paper's (1/B) Σ_i ℓ_i (verl's ``geo_mean``;
  verl also counts rows without tokens in B); ``token_mean`` weighs a row by its length.
  Defaults ε_low = ε_high = 0.4 are the paper's clip range (e^{-0.4}, e^{0.4}).

  Args:
    logprobs, old_logprobs, advantages, mask: as in ``ppo_clip``.
    clip_low, clip_high: ε_low, ε_high on the token log-ratio.
    aggregation, norm_length, weights: as in ``ppo_clip``.

  Returns:
    (scalar loss, metrics).
  """
  adv, log_ratio = _prepare(logprobs, old_logprobs, advantages, mask)
  lengths = jnp.maximum(jnp.sum(mask, axis=-1, keepdims=True), 1.0)
  adv_row = jnp.sum(jnp.broadcast_to(adv, mask.shape) * mask, axis=-1, keepdims=True) / lengths
  over = jnp.where(adv_row > 0, log_ratio > clip_high, log_ratio < -clip_low)
  bound = jnp.where(adv_row > 0, clip_high, -clip_low)
  clipped = jnp.where(over, bound, log_ratio)
  clipped = jnp.where((adv_row != 0) & (mask > 0), clipped, 0.0)
  ratio = jnp.exp(jnp.sum(clipped, axis=-1, keepdims=True) / lengths)  # [B, 1]
  token_loss = jnp.broadcast_to(-adv_row * ratio, mask.shape)
  metrics = _ratio_metrics(jnp.broadcast_to(ratio, mask.shape), mask, over & (adv_row != 0))
  return _finish(token_loss, mask, aggregation, norm_length, metrics, weights)


def luspo(
  logprobs: jax.Array,
  old_logprobs: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  clip_low: float = 3e-4,
  clip_high: float = 4e-4,
  aggregation: str = "seq_mean_token_sum",
  norm_length=None,
  weights: jax.Array | None = None,
):
  """LUSPO, length-unbiased sequence policy optimisation (arXiv 2602.05261; TRL's
  ``loss_type="luspo"``): GSPO's clipped sequence ratio, each response's loss scaled by its
  length,

      L = (1/B) Σ_i |y_i| · ℓ_i,      ℓ_i = -min(s_i A_i, clip(s_i, 1 - ε_low, 1 + ε_high) A_i)

  which is :func:`gspo` under ``aggregation="seq_mean_token_sum"`` (Σ_t of a row's equal token
  losses is |y_i| ℓ_i, and their gradient s_i A_i Σ_t ∇log π(y_t) is d(|y_i| ℓ_i)). That is the
  default here; the RL step passes ``rl.aggregation``, so set it to ``seq_mean_token_sum`` for
  the paper's normaliser (other aggregations make it GSPO). ε defaults are GSPO's.

  Args and returns as in :func:`gspo`.
  """
  return gspo(
    logprobs,
    old_logprobs,
    advantages,
    mask,
    clip_low=clip_low,
    clip_high=clip_high,
    aggregation=aggregation,
    norm_length=norm_length,
    weights=weights,
  )


_VESPO_LOG_W_MIN = math.log(1e-8)


def vespo(
  logprobs: jax.Array,
  old_logprobs: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  k_pos: float = 2.0,
  lambda_pos: float = 3.0,
  k_neg: float = 3.0,
  lambda_neg: float = 2.0,
  aggregation: str = "token_mean",
  norm_length=None,
  weights: jax.Array | None = None,
):
  """VESPO, variational sequence-level soft policy optimisation (arXiv 2602.10693; TRL's
  ``loss_type="vespo"``): a gamma-shaped weight of the sequence ratio replaces the clip,

      log w_i = clip(Σ_t m_t log ρ_t, log 1e-8, 20)          (w_i: the product of token ratios)
      φ(w)    = e^λ · w^k · e^{-λ w}                          (φ(1) = 1, largest at w = k/λ)
      ℓ_t     = -sg(φ(w_i)) · A_t · log π(y_t)

  with (k, λ) = (k_pos, λ_pos) where A ≥ 0 and (k_neg, λ_neg) where A < 0 (λ floored at 1e-4).
  φ only scales the policy gradient (stop-gradient): on-policy every response has weight 1,
  far off-policy responses (w → 0 or w ≫ k/λ) fade smoothly. Token log-ratios are clamped to
  [-20, 20] first. Defaults are TRL's (k_pos 2, λ_pos 3, k_neg 3, λ_neg 2); TRL normalises by
  the batch's tokens (``aggregation="token_mean"``).

  Args:
    logprobs, old_logprobs, advantages, mask: as in ``ppo_family.ppo_clip``.
    k_pos, lambda_pos, k_neg, lambda_neg: the gamma weight's power k and decay λ by sign.
    aggregation, norm_length, weights: as in ``ppo_family.ppo_clip``.

  Returns:
    (scalar loss, metrics with ``vespo/phi_mean``).
  """
  adv, log_ratio = _prepare(logprobs, old_logprobs, advantages, mask)
  log_w = jnp.clip(jnp.sum(log_ratio * mask, axis=-1, keepdims=True), _VESPO_LOG_W_MIN, 20.0)
  nonneg = adv >= 0
  k = jnp.where(nonneg, k_pos, k_neg)
  lam = jnp.maximum(jnp.where(nonneg, lambda_pos, lambda_neg), 1e-4)
  phi = jnp.exp(lam + k * log_w - lam * jnp.exp(log_w))
  phi = jax.lax.stop_gradient(jnp.where(jnp.isfinite(phi), phi, 0.0))
  token_loss = -phi * adv * jnp.where(mask > 0, logprobs, 0.0)
  w = jnp.broadcast_to(jnp.exp(log_w), mask.shape)
  metrics = _ratio_metrics(w, mask, jnp.zeros(mask.shape, bool))
  del metrics["ratio/clip_frac"]
  metrics["vespo/phi_mean"] = reductions.masked_mean(jnp.broadcast_to(phi, mask.shape), mask)
  return _finish(token_loss, mask, aggregation, norm_length, metrics, weights)


POLICY_LOSSES: dict[str, Callable] = {"gspo": gspo, "gmpo": gmpo, "luspo": luspo, "vespo": vespo}
