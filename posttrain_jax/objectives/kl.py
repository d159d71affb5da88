"""KL estimators and entropy.

Shapes: ``B`` sequences, ``T`` tokens, ``V`` vocabulary. Log-probs are float32 ``[B, T]``.
The sample-based estimators follow Schulman (2020), "Approximating KL divergence", with
``log r = log π_ref(y) - log π(y)`` for ``y ~ π``:

    k1 = -log r            (unbiased, high variance, can be negative)
    k2 = (log r)^2 / 2     (biased, low variance)
    k3 = (r - 1) - log r   (unbiased, always >= 0; GRPO's choice)
"""

from typing import Callable

import chex
import jax
import jax.numpy as jnp


def _log_ratio(logprobs, ref_logprobs):
  chex.assert_equal_shape([logprobs, ref_logprobs])
  return ref_logprobs - logprobs


def kl_k1(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
  """Per-token k1 = log π(y) - log π_ref(y). Args ``[B, T]``; returns ``[B, T]``."""
  return -_log_ratio(logprobs, ref_logprobs)


def kl_k2(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
  """Per-token k2 = ½ (log π(y) - log π_ref(y))². Args ``[B, T]``; returns ``[B, T]``."""
  return 0.5 * jnp.square(_log_ratio(logprobs, ref_logprobs))


def kl_k3(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
  """Per-token k3 = exp(log r) - 1 - log r, r = π_ref/π. Args ``[B, T]``; returns ``[B, T]``.

  The log-ratio is clipped to [-20, 20] before ``exp`` so a single wild token cannot overflow.
  """
  log_r = jnp.clip(_log_ratio(logprobs, ref_logprobs), -20.0, 20.0)
  return jnp.exp(log_r) - 1.0 - log_r


KL_ESTIMATORS: dict[str, Callable] = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def entropy_from_logits(logits: jax.Array) -> jax.Array:
  """Entropy of softmax(logits) over the last axis: ``[..., V] -> [...]`` in float32."""
  logits = logits.astype(jnp.float32)
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)
