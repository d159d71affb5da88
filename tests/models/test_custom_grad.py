"""The embedding lookup's custom gradient (models/custom_grad.py) against jnp.take's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posttrain_jax.models.custom_grad import ONE_HOT_EMBED_VOCAB, embed_lookup


@pytest.mark.parametrize("vocab", [23, ONE_HOT_EMBED_VOCAB, 4096])  # one-hot grad; take above
def test_embed_lookup_values_and_gradient_match_take(vocab):
  """The lookup's gradient (a one-hot matmul for small vocabularies) equals jnp.take's
  scatter-add, with repeated tokens summing, in float32; the values bit for bit."""
  embed = jax.random.normal(jax.random.key(2), (vocab, 8))
  tokens = jnp.array([[0, 3, 3, vocab - 1], [3, 0, 5, 3]])
  cot = jax.random.normal(jax.random.key(3), (2, 4, 8))
  f = lambda e: jnp.vdot(embed_lookup(e, tokens), cot)
  ref = lambda e: jnp.vdot(jnp.take(e, tokens, axis=0), cot)
  np.testing.assert_array_equal(embed_lookup(embed, tokens), jnp.take(embed, tokens, axis=0))
  np.testing.assert_allclose(jax.grad(f)(embed), jax.grad(ref)(embed), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(
    jax.jit(jax.grad(f))(embed), jax.grad(ref)(embed), rtol=1e-6, atol=1e-6
  )
