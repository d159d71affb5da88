"""Policy-gradient surrogate losses with token-level ratios: PPO-clip, REINFORCE, SAPO, CISPO,
ASymPO, SPO (sequence-level ratios, GSPO, LUSPO, GMPO, VESPO: ``sequence_level``; HPO / A-HPO:
``hysteretic``; Clip-Cov / KL-Cov: ``covariance``).

Shapes: ``B`` sequences (``B = P*G``: ``P`` prompts, ``G`` rollouts each), ``T`` completion
tokens. Every loss in :data:`POLICY_LOSSES` has the signature::

    fn(logprobs [B, T], old_logprobs [B, T], advantages [B] or [B, T], mask [B, T], *,
       aggregation: str = "token_mean", norm_length=None, weights=None, **hparams)
        -> (loss, metrics)

``logprobs`` carry the gradient; ``old_logprobs`` (the behaviour policy), ``advantages`` and the
optional per-token ``weights [B, T]`` (e.g. truncated importance-sampling weights for a
train-inference mismatch) are wrapped in ``stop_gradient`` inside (:func:`_prepare`,
:func:`_finish`); ``weights`` multiply the per-token loss before aggregation. ``metrics`` holds
``loss/pg_num`` and ``loss/pg_den`` so callers can aggregate exactly across micro-batches (see
reductions.aggregate). ``aggregation`` is the library's token normalisation
(reductions.AGGREGATIONS); each docstring says which aggregation reproduces the paper's own
normaliser, since the train step passes ``aggregation`` from config.
"""

from typing import Callable

import chex
import jax
import jax.numpy as jnp

from posttrain_jax.objectives import reductions

# Every token log-ratio is clamped to [-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT] before exp (verl's
# compute_policy_loss does the same): exp(88.7) is inf in float32, and the branch a min / max
# leaves out would then give 0 * inf = NaN gradients. Inside the bounds nothing changes; beyond
# them the ratio is constant (no gradient), as under verl's clamp.
LOG_RATIO_LIMIT = 20.0


def _prepare(logprobs, old_logprobs, advantages, mask):
  chex.assert_rank([logprobs, old_logprobs, mask], 2)
  chex.assert_equal_shape([logprobs, old_logprobs, mask])
  chex.assert_type([logprobs, old_logprobs, mask], float)
  if advantages.ndim == 1:
    chex.assert_shape(advantages, (logprobs.shape[0],))
    advantages = advantages[:, None]
  else:
    chex.assert_equal_shape([advantages, logprobs])
  advantages = jax.lax.stop_gradient(advantages)
  old_logprobs = jax.lax.stop_gradient(old_logprobs)
  # Masked positions may hold garbage (-inf from padding); zero them before exp.
  log_ratio = jnp.where(mask > 0, logprobs - old_logprobs, 0.0)
  return advantages, jnp.clip(log_ratio, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


def _finish(token_loss, mask, aggregation, norm_length, metrics, weights=None):
  if weights is not None:
    chex.assert_equal_shape([weights, token_loss])
    token_loss = token_loss * jax.lax.stop_gradient(weights)
  agg = reductions.aggregate(token_loss, mask, mode=aggregation, norm_length=norm_length)
  metrics = dict(metrics)
  metrics["loss/pg"] = agg.value
  metrics["loss/pg_num"] = agg.numerator
  metrics["loss/pg_den"] = agg.denominator
  return agg.value, metrics


def ppo_clip(
  logprobs: jax.Array,
  old_logprobs: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  clip_low: float = 0.2,
  clip_high: float = 0.2,
  dual_clip: float | None = None,
  aggregation: str = "token_mean",
  norm_length=None,
  weights: jax.Array | None = None,
):
  """PPO clipped surrogate (Schulman et al. 2017, eq. 7), clip-higher (DAPO, Yu et al. 2025).

      ρ_t = exp(log π(y_t) - log π_old(y_t))
      ℓ_t = -min(ρ_t A, clip(ρ_t, 1 - ε_low, 1 + ε_high) A)

  With ``dual_clip = c > 1`` (Ye et al. 2020), negative-advantage tokens are further bounded:
  ℓ_t = min(ℓ_t, -c A) for A < 0.

  Args:
    logprobs: [B, T] float32 log π(y_t) under the current parameters (differentiated).
    old_logprobs: [B, T] float32 behaviour log-probs (stop-gradient).
    advantages: [B] or [B, T] float32 (stop-gradient).
    mask: [B, T] float32 completion mask.
    clip_low, clip_high: ε_low and ε_high.
    dual_clip: optional c > 1.
    aggregation: a name in reductions.AGGREGATIONS.
    norm_length: the constant length of ``seq_mean_token_sum_norm``.
    weights: optional [B, T] per-token weights (stop-gradient), e.g. TIS weights.

  Returns:
    (scalar loss, metrics).
  """
  adv, log_ratio = _prepare(logprobs, old_logprobs, advantages, mask)
  ratio = jnp.exp(log_ratio)
  unclipped = -ratio * adv
  clipped = -jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
  token_loss = jnp.maximum(unclipped, clipped)
  is_clipped = (clipped > unclipped).astype(jnp.float32)
  if dual_clip is not None:
    dual = -dual_clip * adv
    token_loss = jnp.where(adv < 0, jnp.minimum(token_loss, dual), token_loss)
  metrics = {
    "ratio/mean": reductions.masked_mean(ratio, mask),
    "ratio/max": jnp.max(jnp.where(mask > 0, ratio, 0.0)),
    "ratio/clip_frac": reductions.masked_mean(is_clipped, mask),
  }
  return _finish(token_loss, mask, aggregation, norm_length, metrics, weights)


def reinforce(
  logprobs: jax.Array,
  old_logprobs: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  aggregation: str = "token_mean",
  norm_length=None,
  weights: jax.Array | None = None,
):
  """Vanilla policy gradient (Williams 1992): ℓ_t = -A · log π(y_t).

  ``old_logprobs`` is unused by the loss (kept for the common signature); the ratio to it is
  logged so an off-policy drift stays visible.
  """
  adv, log_ratio = _prepare(logprobs, old_logprobs, advantages, mask)
  token_loss = -adv * logprobs
  metrics = {"ratio/mean": reductions.masked_mean(jnp.exp(log_ratio), mask)}
  return _finish(token_loss, mask, aggregation, norm_length, metrics, weights)


# ---------------------------------------------------------------------------------------------
# Ratio variants: SAPO (soft gate), CISPO (clipped IS weight).


def _ratio_metrics(ratio, mask, clipped):
  return {
    "ratio/mean": reductions.masked_mean(ratio, mask),
    "ratio/max": jnp.max(jnp.where(mask > 0, ratio, 0.0)),
    "ratio/clip_frac": reductions.masked_mean(clipped.astype(jnp.float32), mask),
  }


def sapo(
  logprobs: jax.Array,
  old_logprobs: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  tau_pos: float = 1.0,
  tau_neg: float = 1.05,
  aggregation: str = "token_mean",
  norm_length=None,
  weights: jax.Array | None = None,
):
  """SAPO, soft adaptive policy optimisation (Gao et al. 2025, Qwen, arXiv 2511.20347).

  A sigmoid gate replaces the hard clip of the token ratio ρ_t = π(y_t)/π_old(y_t):

      f_τ(ρ)  = (4/τ) · σ(τ (ρ - 1)),      τ = τ_pos if A_t > 0 else τ_neg
      ℓ_t     = -A_t · f_τ(ρ_t)
      ∇ℓ_t    = -A_t · 4 σ(τ(ρ-1)) (1 - σ(τ(ρ-1))) · ρ_t · ∇log π(y_t)

  At ρ = 1 the gate weight 4 σ(0)(1 - σ(0)) = 1, so the gradient is the vanilla policy gradient
  -A ∇log π; the value there is -2A/τ (the paper's form, not shifted to -A). Off-policy tokens
  are attenuated smoothly instead of cut at a band edge (the weight underflows to 0 in float32
  only far out, e.g. ρ ≳ e^3 at τ = 1); τ_neg > τ_pos makes negative-advantage gates decay
  faster. Defaults τ_pos = 1.0, τ_neg = 1.05 are the paper's. The log-ratio is clamped to
  [-20, 20] before exp (the gate is saturated far earlier). The paper normalises like GRPO
  (``aggregation="seq_mean_token_mean"``).

  Args:
    logprobs, old_logprobs, advantages, mask: as in ``ppo_clip`` ([B, T], [B, T], [B] or
      [B, T], [B, T]).
    tau_pos, tau_neg: gate temperatures for positive and non-positive advantages.
    aggregation, norm_length, weights: as in ``ppo_clip``.

  Returns:
    (scalar loss, metrics).
  """
  adv, log_ratio = _prepare(logprobs, old_logprobs, advantages, mask)
  ratio = jnp.exp(jnp.clip(log_ratio, -20.0, 20.0))
  tau = jnp.where(adv > 0, tau_pos, tau_neg)
  gate = jax.nn.sigmoid(tau * (ratio - 1.0))
  token_loss = -adv * gate * (4.0 / tau)
  grad_weight = jax.lax.stop_gradient(4.0 * gate * (1.0 - gate) * ratio)
  metrics = _ratio_metrics(ratio, mask, jnp.zeros_like(ratio, dtype=bool))
  del metrics["ratio/clip_frac"]
  metrics["sapo/grad_weight_mean"] = reductions.masked_mean(grad_weight, mask)
  return _finish(token_loss, mask, aggregation, norm_length, metrics, weights)


def cispo(
  logprobs: jax.Array,
  old_logprobs: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  eps_low: float | None = None,
  eps_high: float = 0.28,
  aggregation: str = "token_mean",
  norm_length=None,
  weights: jax.Array | None = None,
):
  """CISPO, clipped IS-weight policy optimisation (MiniMax-M1, 2025, arXiv 2506.13585, eq. 4).

      r̂_t = clip(ρ_t, 1 - ε_low, 1 + ε_high),    ρ_t = π(y_t)/π_old(y_t)
      ℓ_t = -sg(r̂_t) · A_t · log π(y_t)

  The IS weight is clipped and stop-gradient, so every token keeps a gradient -r̂_t A_t ∇log π
  (the weight is bounded, the update is never dropped). ``eps_low=None`` means no lower bound
  (the paper sets ε_low "to a large value" and tunes only ε_high). The paper does not publish
  ε_high; the default 0.28 is ours (the DAPO clip-higher value, also the verl/Trinity
  default). The paper normalises by the total token count (``aggregation="token_mean"``).

  Args:
    logprobs, old_logprobs, advantages, mask: as in ``ppo_clip``.
    eps_low: lower clip ε_low, or None for no lower bound.
    eps_high: upper clip ε_high.
    aggregation, norm_length, weights: as in ``ppo_clip``.

  Returns:
    (scalar loss, metrics).
  """
  adv, log_ratio = _prepare(logprobs, old_logprobs, advantages, mask)
  ratio = jnp.exp(log_ratio)
  low = 0.0 if eps_low is None else 1.0 - eps_low
  is_weight = jax.lax.stop_gradient(jnp.clip(ratio, low, 1.0 + eps_high))
  safe_lp = jnp.where(mask > 0, logprobs, 0.0)
  token_loss = -is_weight * adv * safe_lp
  metrics = _ratio_metrics(ratio, mask, (ratio > 1.0 + eps_high) | (ratio < low))
  return _finish(token_loss, mask, aggregation, norm_length, metrics, weights)


# ---------------------------------------------------------------------------------------------
# Behaviour-free current-policy losses: ASymPO and SPO.


def asympo(
  logprobs: jax.Array,
  old_logprobs: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  eps: float = 1e-6,
  aggregation: str = "token_mean",
  norm_length=None,
  weights: jax.Array | None = None,
):
  """ASymPO, behaviour-free asynchronous group RL (arXiv 2606.03070; methods_A §13, derived).

      ℓ_i(θ) = -(1/|y_i|) Σ_t m_t log π(y_t)                  (mean token NLL of response i)
      L      = (1/G) Σ_i A_i · ℓ_i(θ) / sg(ℓ_i(θ))

  [derived] Written per token, ℓ_i / sg(ℓ_i) = Σ_t m_t (-log π(y_t)) / sg(S_i) with
  S_i = Σ_t m_t (-log π(y_t)) (the 1/|y_i| cancels), so the token loss is
  A_t (-log π(y_t)) / max(sg(S_i), eps) and ``aggregation="seq_mean_token_sum"`` gives exactly
  L above (value Σ_i A_i / B, zero for zero-sum group advantages; gradient A_i ∇ℓ_i / ℓ_i).
  ``token_mean`` (the default) scales the same loss by B / Σ m. Only current-policy log-probs
  enter; ``old_logprobs`` is unused except for the logged ratio.

  Args:
    logprobs, old_logprobs, advantages, mask: as in ``ppo_clip``.
    eps: floor on sg(S_i) for a response whose NLL is ~0.
    aggregation, norm_length, weights: as in ``ppo_clip``.

  Returns:
    (scalar loss, metrics).
  """
  adv, log_ratio = _prepare(logprobs, old_logprobs, advantages, mask)
  nll = jnp.where(mask > 0, -logprobs, 0.0)
  seq_nll = jax.lax.stop_gradient(jnp.sum(nll * mask, axis=-1, keepdims=True))  # S_i [B, 1]
  token_loss = reductions.safe_divide(adv * nll, jnp.maximum(seq_nll, eps))
  lengths = jnp.maximum(jnp.sum(mask, axis=-1), 1.0)
  metrics = {
    "ratio/mean": reductions.masked_mean(jnp.exp(log_ratio), mask),
    "asympo/nll_mean": jnp.mean(seq_nll[:, 0] / lengths),
  }
  return _finish(token_loss, mask, aggregation, norm_length, metrics, weights)


def spo(
  logprobs: jax.Array,
  old_logprobs: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  neg_scale: float = 0.5,
  aggregation: str = "token_mean",
  norm_length=None,
  weights: jax.Array | None = None,
):
  """SPO, scaled-negative current-policy loss (arXiv 2606.03070; methods_A §13, derived).

      w_i = 1 if A_i > 0 else c,      c ∈ (0, 1]
      L   = (1/G) Σ_i w_i A_i ℓ_i(θ),  ℓ_i = -(1/|y_i|) Σ_t m_t log π(y_t)

  Token loss -w_t A_t log π(y_t); ``aggregation="seq_mean_token_mean"`` gives exactly L above
  (``token_mean``, the default, weighs tokens equally instead). c = 1 is the naive
  current-policy loss (REINFORCE). No behaviour log-probs, ratios or clipping; ``old_logprobs``
  only feeds the logged ratio. c default 0.5 is ours (methods_A suggests 0.25 or 0.5).

  Args:
    logprobs, old_logprobs, advantages, mask: as in ``ppo_clip``.
    neg_scale: c, the weight of negative-advantage terms.
    aggregation, norm_length, weights: as in ``ppo_clip``.

  Returns:
    (scalar loss, metrics).
  """
  adv, log_ratio = _prepare(logprobs, old_logprobs, advantages, mask)
  w = jnp.where(adv > 0, 1.0, neg_scale)
  token_loss = -w * adv * jnp.where(mask > 0, logprobs, 0.0)
  metrics = {"ratio/mean": reductions.masked_mean(jnp.exp(log_ratio), mask)}
  return _finish(token_loss, mask, aggregation, norm_length, metrics, weights)


POLICY_LOSSES: dict[str, Callable] = {
  "ppo_clip": ppo_clip,
  "reinforce": reinforce,
  "sapo": sapo,
  "cispo": cispo,
  "asympo": asympo,
  "spo": spo,
}
