"""Fused projections (models/fused.py) against the separate ones: the same decode logits, and
the fused weights hold the separate ones."""

import jax
import jax.numpy as jnp
import model_fixtures as mf
import numpy as np
import pytest

from posttrain_jax import models
from posttrain_jax.models import fused, transformer

VARIANTS = mf.VARIANTS
_model = mf.nano_model


def _tokens(b=3, t=10, seed=1):
  return mf.tokens(b, t, seed)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_fused_decode_projections_equal_separate_ones(variant):
  """layer_params() fuses q/k/v and gate/up (one matmul each); a cached decode with them gives
  the logits of the separate projections, and the full forward's."""
  m = _model(**VARIANTS[variant])
  layers = m.layer_params()
  assert all("qkv" in p and "gate_up" in p and "q" not in p and "up" not in p for p in layers)
  stacked = m.layers.stacked(m.config.jnp_dtype)
  separate = tuple({n: w[i] for n, w in stacked.items()} for i in range(m.config.num_layers))
  toks = _tokens()
  full = m(toks).logits

  def decode(layers):
    out = m(toks[:, :4], cache=models.init_cache(m.config, 3, 12), layers=layers)
    pieces, cache = [out.logits], out.cache
    for t in range(4, 10):
      out = m(toks[:, t : t + 1], cache=cache, layers=layers)
      pieces.append(out.logits)
      cache = out.cache
    return jnp.concatenate(pieces, 1)

  a = jax.jit(decode)(layers)
  np.testing.assert_allclose(a, decode(separate), atol=2e-5)
  np.testing.assert_allclose(a, full, atol=2e-5)
  # The fused weight holds each kv head's query heads, then its key and value.
  p, q = layers[0], separate[0]
  K = m.config.num_kv_heads
  np.testing.assert_array_equal(p["qkv"][:, :, -2], q["k"])
  np.testing.assert_array_equal(p["qkv"][:, :, :-2].reshape(q["q"].shape), q["q"])
  np.testing.assert_array_equal(p["gate_up"][..., 1], q["up"])
  assert p["qkv"].shape[1] == K
  assert fused.fuse_projections({"down": q["down"]}) == {"down": q["down"]}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_fused_block_inputs_equal_separate_ones(variant):
  """transformer.qkv and transformer.mlp on a fused layer equal them on the separate layer
  (float32 tolerance: one matmul against three), forward."""
  m = _model(**VARIANTS[variant])
  c = m.config
  stacked = m.layers.stacked(c.jnp_dtype)
  p = {n: w[0] for n, w in stacked.items()}
  h = jax.random.normal(jax.random.key(5), (2, 7, c.hidden_size))
  positions = jnp.broadcast_to(jnp.arange(7), (2, 7))
  rope = transformer.rope_tables(positions, transformer.rope_inv_freq(c))
  for a, b in zip(
    transformer.qkv(c, fused.fuse_projections(p), h, rope), transformer.qkv(c, p, h, rope)
  ):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
    transformer.mlp(c, fused.fuse_projections(p), h), transformer.mlp(c, p, h), rtol=1e-5, atol=1e-5
  )
