"""Train-inference mismatch: importance weights and diagnostics.

The sampler (inference engine, maybe a quantised or low-precision copy μ) returns behaviour
log-probs ``sampler_logprobs [B, T]``; the trainer recomputes ``trainer_logprobs [B, T]`` under
π_θ. The per-token ratio is ρ_t = π_θ(y_t) / μ(y_t) = exp(trainer - sampler). The weights
returned here are stop-gradient ``[B, T]`` arrays to pass as ``weights=`` to any policy loss
(they multiply the per-token loss before aggregation; a token given weight 0 still counts in a
``token_mean`` denominator). Every function in :data:`IS_CORRECTIONS` has the signature::

    fn(trainer_logprobs [B, T], sampler_logprobs [B, T], mask [B, T], **hparams)
        -> (weights [B, T], metrics)

Levels: ``"token"`` uses ρ_t; ``"sequence"`` uses the product Π_t ρ_t = exp(Σ_t m log ρ_t) for
every token of the sequence; ``"geometric"`` uses exp(mean_t log ρ_t) (the length-normalised
sequence ratio).
"""

from typing import Callable

import chex
import jax
import jax.numpy as jnp

from posttrain_jax.objectives import kl, reductions

LEVELS = ("token", "sequence", "geometric")


def _log_ratio(trainer_logprobs, sampler_logprobs, mask, level):
  """Stop-gradient log ρ at the requested level, broadcast to ``[B, T]`` (0 where masked)."""
  chex.assert_rank([trainer_logprobs, sampler_logprobs, mask], 2)
  chex.assert_equal_shape([trainer_logprobs, sampler_logprobs, mask])
  chex.assert_type([trainer_logprobs, sampler_logprobs, mask], float)
  log_r = jnp.where(mask > 0, trainer_logprobs - sampler_logprobs, 0.0)
  log_r = jax.lax.stop_gradient(log_r)
  if level == "token":
    return log_r
  seq = jnp.sum(log_r * mask, axis=-1, keepdims=True)
  if level == "geometric":
    seq = seq / jnp.maximum(jnp.sum(mask, axis=-1, keepdims=True), 1.0)
  elif level != "sequence":
    raise ValueError(f"unknown IS level {level!r}; valid: {', '.join(LEVELS)}")
  return jnp.broadcast_to(seq, log_r.shape)


def tis_weights(
  trainer_logprobs: jax.Array,
  sampler_logprobs: jax.Array,
  mask: jax.Array,
  *,
  level: str = "token",
  cap: float = 2.0,
):
  """Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly
  brings you off-policy RL training"; Ionides 2008):

      w = min(ρ, C),   ρ = π_θ/μ at the chosen level;   computed as exp(min(log ρ, log C))

  Args:
    trainer_logprobs: [B, T] float32 log π_θ (stop-gradient here).
    sampler_logprobs: [B, T] float32 log μ from the sampler (stop-gradient).
    mask: [B, T] float32 completion mask.
    level: "token", "sequence" or "geometric".
    cap: C > 0 (default 2, the paper's).

  Returns:
    (weights [B, T], 0 where masked; metrics ``mismatch/tis_mean``, ``mismatch/tis_capped_frac``).
  """
  log_r = _log_ratio(trainer_logprobs, sampler_logprobs, mask, level)
  log_cap = jnp.log(jnp.asarray(cap, jnp.float32))
  w = jnp.where(mask > 0, jnp.exp(jnp.minimum(log_r, log_cap)), 0.0)
  capped = (log_r > log_cap).astype(jnp.float32)
  return w, {
    "mismatch/tis_mean": reductions.masked_mean(w, mask),
    "mismatch/tis_capped_frac": reductions.masked_mean(capped, mask),
  }


def mis_weights(
  trainer_logprobs: jax.Array,
  sampler_logprobs: jax.Array,
  mask: jax.Array,
  *,
  level: str = "token",
  low: float = 0.5,
  high: float = 2.0,
  keep_ratio: bool = False,
):
  """Masked importance sampling: keep tokens (or whole sequences) whose ratio is in the band.

      w = 1[low ≤ ρ ≤ high]              (``keep_ratio=True``: w = ρ · 1[low ≤ ρ ≤ high])

  A token (level "token") or every token of a sequence (levels "sequence", "geometric") outside
  [low, high] gets weight 0 and so no gradient. The band is compared in log space (no overflow).
  Defaults low = 0.5, high = 2 are ours.

  Args:
    trainer_logprobs: [B, T] float32 log π_θ (stop-gradient here).
    sampler_logprobs: [B, T] float32 log μ (stop-gradient).
    mask: [B, T] float32 completion mask.
    level: "token", "sequence" or "geometric".
    low, high: the band, 0 < low ≤ 1 ≤ high.
    keep_ratio: weight kept tokens by ρ instead of 1.

  Returns:
    (weights [B, T], 0 where masked; metrics ``mismatch/mis_keep_frac``).
  """
  log_r = _log_ratio(trainer_logprobs, sampler_logprobs, mask, level)
  inside = (log_r >= jnp.log(low)) & (log_r <= jnp.log(high)) & (mask > 0)
  value = jnp.exp(jnp.minimum(log_r, jnp.log(high))) if keep_ratio else 1.0
  w = jnp.where(inside, value, 0.0)
  return w, {"mismatch/mis_keep_frac": reductions.masked_mean(inside.astype(jnp.float32), mask)}


def no_correction(
  trainer_logprobs: jax.Array, sampler_logprobs: jax.Array, mask: jax.Array, *, level: str = "token"
):
  """No correction: weights = mask (``[B, T]``), metrics empty. ``level`` is checked only."""
  _log_ratio(trainer_logprobs, sampler_logprobs, mask, level)
  return jnp.asarray(mask, jnp.float32), {}


def masked_quantile(x: jax.Array, mask: jax.Array, q: float) -> jax.Array:
  """The q-quantile of ``x`` over entries where ``mask > 0`` (numpy's "linear" rule).

  Static shapes: masked entries are sorted to the end as +inf, and the two order statistics
  around position q·(n-1) are read with dynamic indices. Returns 0 when the mask is empty.
  Args: ``x`` and ``mask`` of the same shape (any rank); ``q`` in [0, 1].
  """
  chex.assert_equal_shape([x, mask])
  flat = jnp.where(mask > 0, x, jnp.inf).reshape(-1)
  ordered = jnp.sort(flat)
  n = jnp.sum(mask > 0)
  pos = q * jnp.maximum(n - 1, 0).astype(jnp.float32)
  lo = jnp.floor(pos).astype(jnp.int32)
  hi = jnp.minimum(lo + 1, jnp.maximum(n - 1, 0))
  frac = pos - lo.astype(jnp.float32)
  a, b = ordered[lo], ordered[hi]
  value = a + (b - a) * frac  # hi <= n - 1, so a and b are real entries when n > 0
  return jnp.where(n > 0, value, 0.0)


def mismatch_metrics(
  trainer_logprobs: jax.Array, sampler_logprobs: jax.Array, mask: jax.Array
) -> dict:
  """Diagnostics of π_θ vs μ on the sampled tokens (all stop-gradient).

      mismatch/k3        masked mean of k3 = ρ - 1 - log ρ, ρ = π_θ/μ (estimates KL(μ ‖ π_θ)
                         for y ~ μ; Schulman 2020)
      mismatch/ratio_p05, _p50, _p95, ratio_max   masked quantiles / max of the token ratio ρ

  Args: trainer_logprobs, sampler_logprobs, mask: [B, T] float32. Returns a dict of scalars.
  """
  log_r = _log_ratio(trainer_logprobs, sampler_logprobs, mask, "token")
  ratio = jnp.exp(jnp.clip(log_r, -20.0, 20.0))
  sampler = jax.lax.stop_gradient(sampler_logprobs)
  k3 = kl.kl_k3(
    jnp.where(mask > 0, sampler, 0.0),
    jnp.where(mask > 0, jax.lax.stop_gradient(trainer_logprobs), 0.0),
  )
  out = {"mismatch/k3": reductions.masked_mean(k3, mask)}
  for q, name in ((0.05, "p05"), (0.5, "p50"), (0.95, "p95")):
    out[f"mismatch/ratio_{name}"] = masked_quantile(ratio, mask, q)
  out["mismatch/ratio_max"] = jnp.max(jnp.where(mask > 0, ratio, 0.0))
  return out


IS_CORRECTIONS: dict[str, Callable] = {
  "none": no_correction,
  "tis": tis_weights,
  "mis": mis_weights,
}
