"""KL estimators, entropy and the exact full-vocabulary KL.

Shapes: ``B`` sequences, ``T`` tokens, ``V`` vocabulary. Log-probs are float32 ``[B, T]``.
The sample-based estimators follow Schulman (2020), "Approximating KL divergence", with
``log r = log π_ref(y) - log π(y)`` for ``y ~ π``:

    k1 = -log r            (unbiased, high variance, can be negative)
    k2 = (log r)^2 / 2     (biased, low variance)
    k3 = (r - 1) - log r   (unbiased, always >= 0; GRPO's choice)

plus ``abs`` = |log r| and the straight-through ``k1+`` / ``k3+`` (their value, k2's gradient).
"""

from typing import Callable

import chex
import jax
import jax.numpy as jnp

from posttrain_jax.objectives import reductions


def _log_ratio(logprobs, ref_logprobs):
  chex.assert_equal_shape([logprobs, ref_logprobs])
  return ref_logprobs - logprobs


def kl_k1(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
  """Per-token k1 = log π(y) - log π_ref(y). Args ``[B, T]``; returns ``[B, T]``."""
  return -_log_ratio(logprobs, ref_logprobs)


def kl_k2(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
  """Per-token k2 = ½ (log π(y) - log π_ref(y))². Args ``[B, T]``; returns ``[B, T]``."""
  return 0.5 * jnp.square(_log_ratio(logprobs, ref_logprobs))


def kl_k3(logprobs: jax.Array, ref_logprobs: jax.Array, *, clamp: float | None = None) -> jax.Array:
  """Per-token k3 = exp(log r) - 1 - log r, r = π_ref/π. Args ``[B, T]``; returns ``[B, T]``.

  The log-ratio is clipped to [-20, 20] before ``exp`` so a single wild token cannot overflow.
  ``clamp = c`` bounds the output to [-c, c] (verl clamps k3 to [-10, 10]; beyond the bound a
  token has no gradient). The default ``None`` keeps the estimate unbiased (docs/reference.md,
  "Conventions"); the KL term's ``rl.kl_estimator_kwargs`` selects it.
  """
  log_r = jnp.clip(_log_ratio(logprobs, ref_logprobs), -20.0, 20.0)
  k3 = jnp.exp(log_r) - 1.0 - log_r
  return k3 if clamp is None else jnp.clip(k3, -clamp, clamp)


def kl_abs(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
  """Per-token |log π(y) - log π_ref(y)| (verl's ``abs``; not an unbiased KL estimate)."""
  return jnp.abs(_log_ratio(logprobs, ref_logprobs))


def straight_through(value: jax.Array, logprobs: jax.Array, ref_logprobs: jax.Array):
  """``value`` forward, the gradient of k2 backward: ``k2 - sg(k2) + sg(value)``.

  For y ~ π the expected gradient of k2 = ½ (log π - log π_ref)² is the gradient of
  KL(π ‖ π_ref), while those of k1 and k3 are not (k1's is 0 in expectation); the "+"
  estimators keep their unbiased value and take k2's gradient (verl's ``k1+``, ``k3+``)."""
  k2 = kl_k2(logprobs, ref_logprobs)
  return k2 - jax.lax.stop_gradient(k2) + jax.lax.stop_gradient(value)


def kl_k1_plus(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
  """k1's value with k2's gradient (:func:`straight_through`). Args ``[B, T]``; returns ``[B, T]``."""
  return straight_through(kl_k1(logprobs, ref_logprobs), logprobs, ref_logprobs)


def kl_k3_plus(
  logprobs: jax.Array, ref_logprobs: jax.Array, *, clamp: float | None = None
) -> jax.Array:
  """k3's value (with its ``clamp``) and k2's gradient (:func:`straight_through`)."""
  value = kl_k3(logprobs, ref_logprobs, clamp=clamp)
  return straight_through(value, logprobs, ref_logprobs)


KL_ESTIMATORS: dict[str, Callable] = {
  "k1": kl_k1,
  "k2": kl_k2,
  "k3": kl_k3,
  "abs": kl_abs,
  "k1+": kl_k1_plus,
  "k3+": kl_k3_plus,
}


def entropy_from_logits(logits: jax.Array) -> jax.Array:
  """Entropy of softmax(logits) over the last axis: ``[..., V] -> [...]`` in float32."""
  logits = logits.astype(jnp.float32)
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


# ---------------------------------------------------------------------------------------------
# Exact KL over the vocabulary.


def token_full_kl(logits: jax.Array, ref_logits: jax.Array, *, direction: str = "reverse"):
  """``[B, T]`` exact per-token KL between softmax(logits) = π and softmax(ref_logits) = π_ref
  in float32 (see :func:`full_kl`); ``ref_logits`` is stop-gradient, zero-weight terms are 0."""
  chex.assert_rank([logits, ref_logits], 3)
  chex.assert_equal_shape([logits, ref_logits])
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  logq = jax.nn.log_softmax(jax.lax.stop_gradient(ref_logits).astype(jnp.float32), axis=-1)
  if direction == "reverse":
    weight, diff = jnp.exp(logp), logp - logq
  elif direction == "forward":
    weight, diff = jnp.exp(logq), logq - logp
  else:
    raise ValueError(f"unknown KL direction {direction!r}; valid: forward, reverse")
  return jnp.sum(weight * jnp.where(weight > 0, diff, 0.0), axis=-1)


def full_kl(
  logits: jax.Array, ref_logits: jax.Array, mask: jax.Array, *, direction: str = "reverse"
):
  """Exact per-token KL between softmax(logits) = π and softmax(ref_logits) = π_ref, in float32:

      reverse:  KL(π ‖ π_ref) = Σ_v π (log π - log π_ref)   (what k1/k3 estimate for y ~ π)
      forward:  KL(π_ref ‖ π) = Σ_v π_ref (log π_ref - log π)

  returned as the masked mean over tokens. ``ref_logits`` is stop-gradient; terms with zero
  weight are exactly 0 (no NaN from -inf logits).

  Args:
    logits: [B, T, V] policy logits (differentiated; any float dtype).
    ref_logits: [B, T, V] reference/teacher logits (stop-gradient).
    mask: [B, T] float32 completion mask.
    direction: "reverse" or "forward".

  Returns:
    (masked mean KL, metrics ``kl/full_<direction>`` and its ``_num``/``_den``).
  """
  chex.assert_rank(mask, 2)
  chex.assert_equal_shape_prefix([logits, mask], 2)
  per_token = token_full_kl(logits, ref_logits, direction=direction)  # [B, T]
  num, den = reductions.masked_sum(per_token, mask), jnp.sum(mask)
  value = num / jnp.maximum(den, 1.0)
  name = f"kl/full_{direction}"
  return value, {name: value, f"{name}_num": num, f"{name}_den": den}
