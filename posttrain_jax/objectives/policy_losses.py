"""Policy-gradient surrogate losses.

Shapes: ``B`` sequences, ``T`` completion tokens. Every loss in :data:`POLICY_LOSSES` has the
signature::

    fn(logprobs [B, T], old_logprobs [B, T], advantages [B] or [B, T], mask [B, T], *,
       aggregation: str = "token_mean", norm_length=None, weights=None, **hparams)
        -> (loss, metrics)

``logprobs`` carry the gradient; ``old_logprobs`` (the behaviour policy), ``advantages`` and the
optional per-token ``weights [B, T]`` (e.g. truncated importance-sampling weights for a
train-inference mismatch) are wrapped in ``stop_gradient`` inside; ``weights`` multiply the
per-token loss before aggregation. ``metrics`` holds ``loss/pg_num`` and ``loss/pg_den`` so
callers can aggregate exactly across micro-batches (see reductions.aggregate).
"""

from typing import Callable

import chex
import jax
import jax.numpy as jnp

from posttrain_jax.objectives import reductions


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
  return advantages, log_ratio


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


def ppo_clip(logprobs: jax.Array, old_logprobs: jax.Array, advantages: jax.Array,
             mask: jax.Array, *, clip_low: float = 0.2, clip_high: float = 0.2,
             dual_clip: float | None = None, aggregation: str = "token_mean",
             norm_length=None, weights: jax.Array | None = None):
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


def reinforce(logprobs: jax.Array, old_logprobs: jax.Array, advantages: jax.Array,
              mask: jax.Array, *, aggregation: str = "token_mean", norm_length=None,
              weights: jax.Array | None = None):
  """Vanilla policy gradient (Williams 1992): ℓ_t = -A · log π(y_t).

  ``old_logprobs`` is unused by the loss (kept for the common signature); the ratio to it is
  logged so an off-policy drift stays visible.
  """
  adv, log_ratio = _prepare(logprobs, old_logprobs, advantages, mask)
  token_loss = -adv * logprobs
  metrics = {"ratio/mean": reductions.masked_mean(jnp.exp(log_ratio), mask)}
  return _finish(token_loss, mask, aggregation, norm_length, metrics, weights)


POLICY_LOSSES: dict[str, Callable] = {
    "ppo_clip": ppo_clip,
    "reinforce": reinforce,
}
