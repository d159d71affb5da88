"""Masked reductions shared by every loss.

Shapes: ``B`` sequences, ``T`` completion tokens. Masks are float ``[B, T]`` (1 = real token).

Every loss aggregates its per-token terms through :func:`aggregate`, which returns a numerator
and a denominator instead of a ratio, so that a token mean stays exact when a batch is split into
micro-batches or across devices: sum the numerators, sum the denominators, then divide once.
"""

from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp

from posttrain_jax.registry import lookup


def masked_sum(x: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
  """Sum of ``x * mask``; masked entries contribute exactly zero (no NaN leaks)."""
  chex.assert_equal_shape([x, mask])
  return jnp.sum(jnp.where(mask > 0, x * mask, 0.0), axis=axis)


def masked_mean(x: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
  """Mean of ``x`` over entries where ``mask`` is non-zero (0 when the mask is empty)."""
  total = masked_sum(x, mask, axis=axis)
  count = jnp.sum(mask, axis=axis)
  return total / jnp.maximum(count, 1.0)


def masked_var(x: jax.Array, mask: jax.Array, axis=None, *, ddof: int = 0) -> jax.Array:
  """Variance over masked entries, with ``ddof`` degrees of freedom removed."""
  mean = masked_mean(x, mask, axis=axis)
  mean_b = mean if axis is None else jnp.expand_dims(mean, axis)
  sq = masked_sum(jnp.square(x - mean_b), mask, axis=axis)
  count = jnp.sum(mask, axis=axis)
  return sq / jnp.maximum(count - ddof, 1.0)


def safe_divide(numerator: jax.Array, denominator: jax.Array) -> jax.Array:
  """``numerator / denominator`` where the denominator is > 0, else exactly 0 (no NaN in the
  value or the gradient): a whitening's zero spread (a size-1 or all-equal group with
  ``eps = 0``) gives zero advantage, as it does with ``eps > 0``."""
  ok = denominator > 0
  return jnp.where(ok, numerator / jnp.where(ok, denominator, 1.0), 0.0)


WHITENINGS = ("population", "unbiased")


def masked_whiten(
  x: jax.Array,
  mask: jax.Array,
  *,
  shift_mean: bool = True,
  eps: float = 1e-8,
  whitening: str = "population",
) -> jax.Array:
  """(x - mean) / scale over all masked entries; masked entries are returned as 0.

  ``mask`` weighs the statistics (a row's token count as its weight gives the statistics of the
  token tile). ``whitening`` is the convention (docs/reference.md, "Conventions"):

      population:  scale = sqrt(var_n) + eps                  (the library's default)
      unbiased:    scale = sqrt(var_{n-1} + eps),  n = Σ mask   (verl's ``masked_whiten``)

  The two differ by sqrt(n/(n-1)) (1.07 for n = 8). When every masked entry is equal the
  centred values are exactly 0 under both (the float32 mean can be one rounding step off, which
  the tiny scale would blow up; verl returns that rounding error times 1e4): all-equal rewards
  give exactly zero advantage, also with ``eps = 0``."""
  if whitening not in WHITENINGS:
    raise ValueError(f"unknown whitening {whitening!r}; valid: {', '.join(WHITENINGS)}")
  on = mask > 0
  flat = jnp.max(jnp.where(on, x, -jnp.inf)) == jnp.min(jnp.where(on, x, jnp.inf))
  mean = masked_mean(x, mask)
  if whitening == "population":
    scale = jnp.where(flat, 0.0, jnp.sqrt(masked_var(x, mask))) + eps
  else:
    scale = jnp.sqrt(jnp.where(flat, 0.0, masked_var(x, mask, ddof=1)) + eps)
  centred = jnp.where(flat, 0.0, x - mean)
  out = safe_divide(centred if shift_mean else x, scale)
  return jnp.where(on, out, 0.0)


class Aggregate(NamedTuple):
  """A loss as ``numerator / denominator``; ``value`` is their ratio for this batch."""

  numerator: jax.Array
  denominator: jax.Array

  @property
  def value(self) -> jax.Array:
    return self.numerator / jnp.maximum(self.denominator, 1e-8)


def token_mean(token_loss: jax.Array, mask: jax.Array, *, norm_length=None) -> Aggregate:
  """Σ_{b,t} ℓ·m / Σ_{b,t} m: every token weighs the same (DAPO)."""
  del norm_length
  return Aggregate(masked_sum(token_loss, mask), jnp.sum(mask))


def seq_mean_token_mean(token_loss: jax.Array, mask: jax.Array, *, norm_length=None) -> Aggregate:
  """(1/B) Σ_b [Σ_t ℓ·m / Σ_t m]: every sequence weighs the same (original GRPO)."""
  del norm_length
  per_seq = masked_sum(token_loss, mask, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1.0)
  has_tokens = (jnp.sum(mask, axis=-1) > 0).astype(jnp.float32)
  return Aggregate(jnp.sum(per_seq * has_tokens), jnp.sum(has_tokens))


def seq_mean_token_sum(token_loss: jax.Array, mask: jax.Array, *, norm_length=None) -> Aggregate:
  """(1/B) Σ_b Σ_t ℓ·m: sequence sums, averaged over sequences."""
  del norm_length
  has_tokens = (jnp.sum(mask, axis=-1) > 0).astype(jnp.float32)
  return Aggregate(masked_sum(token_loss, mask), jnp.sum(has_tokens))


def seq_mean_token_sum_norm(
  token_loss: jax.Array, mask: jax.Array, *, norm_length=None
) -> Aggregate:
  """Σ_{b,t} ℓ·m / (B · L): Dr.GRPO's constant normaliser (Liu et al. 2025, eq. 3).

  ``L`` is ``norm_length`` (the generation budget) or, when None, the padded length ``T``.
  ``B`` counts the rows with at least one unmasked token: every real completion (it has at
  least its EOS or first token), not the padding rows of a padded layout (CERO's variable
  groups, a replay share not yet filled), whose mask is all zero.
  """
  length = token_loss.shape[-1] if norm_length is None else norm_length
  rows = jnp.sum((jnp.sum(mask, axis=-1) > 0).astype(jnp.float32))
  return Aggregate(masked_sum(token_loss, mask), rows * length)


def token_sum_norm(token_loss: jax.Array, mask: jax.Array, *, norm_length=None) -> Aggregate:
  """Σ_{b,t} ℓ·m / L: verl's ``seq-mean-token-sum-norm`` (its value has no 1/B).

  The convention differs from :func:`seq_mean_token_sum_norm` (Dr.GRPO's ``1/(B·L)``) by the
  factor B, the number of rows with tokens: the gradient is B times larger, as a learning rate
  B times larger would make it. ``L`` as in :func:`seq_mean_token_sum_norm`."""
  length = token_loss.shape[-1] if norm_length is None else norm_length
  return Aggregate(masked_sum(token_loss, mask), jnp.asarray(length, jnp.float32))


AGGREGATIONS: dict[str, Callable[..., Aggregate]] = {
  "token_mean": token_mean,
  "seq_mean_token_mean": seq_mean_token_mean,
  "seq_mean_token_sum": seq_mean_token_sum,
  "seq_mean_token_sum_norm": seq_mean_token_sum_norm,
  "token_sum_norm": token_sum_norm,
}


def aggregate(
  token_loss: jax.Array, mask: jax.Array, *, mode: str = "token_mean", norm_length=None
) -> Aggregate:
  """Reduces a per-token loss ``[B, T]`` with the aggregation named ``mode``."""
  chex.assert_rank([token_loss, mask], 2)
  chex.assert_equal_shape([token_loss, mask])
  return lookup(AGGREGATIONS, mode, "aggregation")(token_loss, mask, norm_length=norm_length)
