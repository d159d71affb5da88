"""The embedding lookup with a one-hot matmul gradient for small vocabularies.

``jnp.take``'s gradient is a scatter-add, which XLA:CPU runs as a while loop over every token
(B*T iterations per step). For a small vocabulary the same sums are one matmul
``one_hot(tokens).T @ g``, at HIGHEST precision (exact float32 sums).
"""

import jax
import jax.numpy as jnp

# Vocabularies up to this size take the embedding gradient as a one-hot matmul.
ONE_HOT_EMBED_VOCAB = 512


@jax.custom_vjp
def _one_hot_grad_lookup(embed: jax.Array, tokens: jax.Array) -> jax.Array:
  return jnp.take(embed, tokens, axis=0)


def _lookup_fwd(embed, tokens):
  return jnp.take(embed, tokens, axis=0), (tokens, embed.shape[0])


def _lookup_bwd(res, g):
  tokens, vocab = res
  one_hot = jax.nn.one_hot(tokens.reshape(-1), vocab, dtype=g.dtype)  # [N, V]
  grad = jnp.dot(
    one_hot.T, g.reshape(-1, g.shape[-1]), precision=jax.lax.Precision.HIGHEST
  )  # exact sums
  return grad, None


_one_hot_grad_lookup.defvjp(_lookup_fwd, _lookup_bwd)


def embed_lookup(embed: jax.Array, tokens: jax.Array) -> jax.Array:
  """``embed[tokens]``: ``[V, D], [B, T] -> [B, T, D]``; for V <= ``ONE_HOT_EMBED_VOCAB`` the
  gradient is the one-hot matmul, else ``jnp.take``'s scatter-add."""
  if embed.shape[0] > ONE_HOT_EMBED_VOCAB:
    return jnp.take(embed, tokens, axis=0)
  return _one_hot_grad_lookup(embed, tokens)
