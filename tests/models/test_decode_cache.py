"""The decode cache (models/decode_cache.py) and its API against the reference full forward:
prefill + decode steps, the shared prefill, growing the cache, and the cache layout's
attention against the reference attention over the same keys."""

import jax
import jax.numpy as jnp
import model_fixtures as mf
import numpy as np
import pytest

from posttrain_jax.models import decode_cache
from posttrain_jax.models.transformer import attention, attention_mask

VARIANTS = mf.VARIANTS
_model = mf.nano_model


def _tokens(b=4, t=12, seed=1):
  return mf.tokens(b, t, seed)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_prefill_decode_steps_and_grow_equal_the_full_forward(variant):
  """init_cache -> prefill -> decode_step (growing the cache once on the way) gives the full
  forward's logits on left-padded rows' real positions."""
  m = _model(**VARIANTS[variant])
  toks = _tokens()
  start = jnp.array([0, 2, 3, 1], jnp.int32)
  full = m(toks, start=start).logits
  layers = m.layer_params()
  cache = decode_cache.init_cache(m.config, 4, 7, start)
  out = decode_cache.prefill(m, toks[:, :5], cache, layers=layers)
  pieces, cache = [out.logits], out.cache
  for t in range(5, 12):
    cache = decode_cache.grow(cache, t + 1)
    out = decode_cache.decode_step(m, toks[:, t], cache, layers=layers)
    pieces.append(out.logits)
    cache = out.cache
  real = (jnp.arange(12)[None, :] >= start[:, None])[..., None]
  np.testing.assert_allclose(
    jnp.where(real, jnp.concatenate(pieces, 1), 0), jnp.where(real, full, 0), atol=2e-5
  )
  assert int(cache.index) == 12 and cache.length == 12
  assert decode_cache.grow(cache, 10) is cache


def test_shared_prefill_equals_the_per_row_prefill():
  """prefill_shared (one prefill per prompt, repeated to its group) gives every row the
  per-row prefill's last logits and a cache that decodes the same, bit for bit."""
  m = _model()
  prompts = jnp.repeat(_tokens(b=2, t=6), 3, axis=0)
  start = jnp.repeat(jnp.array([0, 2], jnp.int32), 3)
  layers = m.layer_params()
  shared = decode_cache.prefill_shared(m, prompts, start, 3, 9, layers=layers)
  per_row = decode_cache.prefill(
    m, prompts, decode_cache.init_cache(m.config, 6, 9, start), layers=layers
  )
  np.testing.assert_array_equal(shared.logits[:, 0], per_row.logits[:, -1])
  nxt = jnp.arange(6, dtype=jnp.int32) + 3
  a = decode_cache.decode_step(m, nxt, shared.cache, layers=layers)
  b = decode_cache.decode_step(m, nxt, per_row.cache, layers=layers)
  np.testing.assert_array_equal(a.logits, b.logits)


def test_write_and_attend_equals_the_reference_attention():
  """One layer's cache write + attention equals the reference attention over the keys and
  values written so far (GQA, left padding)."""
  Bn, S, H, K, hd, T = 3, 8, 4, 2, 8, 2
  ks = jax.random.split(jax.random.key(0), 5)
  k_all = jax.random.normal(ks[0], (Bn, S, K, hd))
  v_all = jax.random.normal(ks[1], (Bn, S, K, hd))
  q = jax.random.normal(ks[2], (Bn, T, H, hd))
  start = jnp.array([0, 1, 4])
  index = 5
  # The cache holds positions < index; this call writes index .. index + T - 1.
  buffers = (
    jnp.transpose(k_all, (0, 2, 3, 1)).at[..., index:].set(0.0),
    jnp.swapaxes(v_all, 1, 2).at[:, :, index:].set(0.0),
  )
  mask = attention_mask(start, jnp.asarray(index), T, S)
  out, (kb, vb) = decode_cache.write_and_attend(
    buffers, jnp.asarray(index), q, k_all[:, index : index + T], v_all[:, index : index + T], mask
  )
  np.testing.assert_allclose(out, attention(q, k_all, v_all, mask), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(kb, jnp.transpose(k_all, (0, 2, 3, 1)).at[..., 7:].set(0.0))
  np.testing.assert_array_equal(vb, jnp.swapaxes(v_all, 1, 2).at[:, :, 7:].set(0.0))
