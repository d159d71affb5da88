"""The attention fast paths (models/attention.py) against the reference transformer.attention:
the cache layout's grouped products, causal query blocks and jax.nn.dot_product_attention,
with left padding (``start`` offsets) and grouped-query heads (H = 4, K = 2)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posttrain_jax import models
from posttrain_jax.models import attention as attention_lib
from posttrain_jax.models import transformer
from posttrain_jax.models.transformer import attention, attention_mask

B, H, K, hd = 3, 4, 2, 8


def _qkv(T, S, seed=0):
  ks = jax.random.split(jax.random.key(seed), 3)
  return (
    jax.random.normal(ks[0], (B, T, H, hd)),
    jax.random.normal(ks[1], (B, S, K, hd)),
    jax.random.normal(ks[2], (B, S, K, hd)),
  )


def _padded_mask(T, S, start=(0, 3, 7)):
  """Causal mask of the last T of S positions over rows real from ``start``, and [B, T, 1, 1]
  True where the query is a real position."""
  start = jnp.array(start)
  mask = attention_mask(start, jnp.asarray(S - T, jnp.int32), T, S)
  real = ((S - T + jnp.arange(T))[None, :] >= start[:, None])[..., None, None]
  return mask, real


def _numpy_attention(q, k, v, mask):
  qn, kn, vn, mn = (np.asarray(a, np.float64) for a in (q, k, v, mask))
  out = np.zeros(q.shape)
  for b in range(q.shape[0]):
    for h in range(q.shape[2]):
      kv = h // (q.shape[2] // k.shape[2])
      s = qn[b, :, h] @ kn[b, :, kv].T / np.sqrt(q.shape[3])
      s = np.where(mn[b] > 0, s, -np.inf)
      p = np.exp(s - s.max(-1, keepdims=True))
      out[b, :, h] = (p / p.sum(-1, keepdims=True)) @ vn[b, :, kv]
  return out


@pytest.mark.parametrize("T", [1, 3])
def test_grouped_products_in_the_cache_layout_equal_the_reference(T):
  """Keys [B, K, hd, S] (the decode cache) or [B, K, S, hd], values [B, K, S, hd]: the same
  attention as the reference, masked keys included, and as a per-head numpy loop."""
  S = 5
  q, k, v = _qkv(T, S)
  mask = jax.random.bernoulli(jax.random.key(9), 0.7, (B, T, S)).at[:, :, 0].set(True)
  ref = attention(q, k, v, mask)
  values = jnp.swapaxes(v, 1, 2)
  transposed = attention_lib.grouped_products(
    q, jnp.transpose(k, (0, 2, 3, 1)), values, mask, keys_transposed=True
  )
  plain = attention_lib.grouped_products(
    q, jnp.swapaxes(k, 1, 2), values, mask, keys_transposed=False
  )
  np.testing.assert_allclose(transposed, ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(plain, transposed, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ref, _numpy_attention(q, k, v, mask), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("prefix", [0, 4])
def test_causal_blocks_equal_the_reference_on_real_positions(prefix):
  """Query blocks over left-padded rows (after ``prefix`` keys that precede every query, as in
  the grouped forward): every real query is exact, gradients too."""
  T = 11
  q, k, v = _qkv(T, prefix + T, seed=1)
  mask, real = _padded_mask(T, prefix + T)

  def loss(q, k, v, block):
    out = attention_lib.causal_blocks(q, k, v, mask, block) if block else attention(q, k, v, mask)
    return jnp.sum(jnp.where(real, jnp.sin(out), 0.0)), out

  (l0, out0), g0 = jax.value_and_grad(loss, (0, 1, 2), has_aux=True)(q, k, v, 0)
  for block in (2, 4, 5):
    (l1, out1), g1 = jax.value_and_grad(loss, (0, 1, 2), has_aux=True)(q, k, v, block)
    np.testing.assert_allclose(jnp.where(real, out1, 0), jnp.where(real, out0, 0), atol=1e-6)
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    for a, b in zip(g0, g1):
      np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("T, S", [(9, 9), (1, 9), (4, 9)])
def test_dot_product_attention_xla_equals_the_reference(T, S):
  """jax.nn.dot_product_attention (implementation='xla', GQA: H = 4 over K = 2) equals the
  reference on every real query of left-padded rows (start 0, 3, 7), values and gradients,
  for the full causal forward (T = S), a decode step (T = 1) and a chunk (T = 4)."""
  q, k, v = _qkv(T, S, seed=2)
  mask, real = _padded_mask(T, S)

  def loss(q, k, v, fast):
    out = (
      attention_lib.dot_product_attention(q, k, v, mask, implementation="xla")
      if fast
      else attention(q, k, v, mask)
    )
    return jnp.sum(jnp.where(real, jnp.sin(out), 0.0)), out

  (l0, out0), g0 = jax.value_and_grad(loss, (0, 1, 2), has_aux=True)(q, k, v, False)
  (l1, out1), g1 = jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True), static_argnums=3)(
    q, k, v, True
  )
  np.testing.assert_allclose(jnp.where(real, out1, 0), jnp.where(real, out0, 0), atol=1e-6)
  np.testing.assert_allclose(l1, l0, rtol=1e-6)
  for a, b in zip(g0, g1):
    np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("variant", [{}, {"qk_norm": True, "qkv_bias": True}])
def test_decoder_with_dot_product_attention_equals_the_reference(variant):
  """A whole model forced onto jax.nn.dot_product_attention ('xla', the GPU path's kernel
  on CPU): the reference model's logits on the real positions of left-padded rows, and its
  gradients; the grouped forward too."""
  base = models.preset("nano", vocab_size=23, **variant)
  tokens = jax.random.randint(jax.random.key(3), (4, 10), 2, 23)
  start = jnp.array([0, 2, 5, 0], jnp.int32)
  real = (jnp.arange(10)[None, :] >= start[:, None])[..., None]

  def run(impl):
    cfg = dataclasses.replace(base, attention_impl=impl)
    graphdef, params = nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0)), nnx.Param)

    def loss(p):
      logits = nnx.merge(graphdef, p)(tokens, start=start).logits
      return jnp.sum(jnp.where(real, jax.nn.log_softmax(logits), 0.0)), logits

    (value, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    grouped = models.grouped_forward(
      nnx.merge(graphdef, params), tokens[::2, :6], start[::2], tokens[:, 6:], 2
    )
    return value, jnp.where(real, logits, 0.0), grads, grouped.logits

  ref, fast = run("reference"), run("xla")
  np.testing.assert_allclose(fast[0], ref[0], rtol=1e-5)
  np.testing.assert_allclose(fast[1], ref[1], atol=2e-5)
  for a, b in zip(jax.tree.leaves(fast[2]), jax.tree.leaves(ref[2])):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(fast[3], ref[3], atol=2e-5)


def test_implementation_choice():
  """'auto' keeps the reference (and causal blocks) on CPU; explicit choices are kept; a bad
  name is refused."""
  cfg = models.preset("nano")
  if jax.default_backend() == "cpu":
    assert attention_lib.implementation(cfg) == "reference"
  for impl in ("reference", "xla", "cudnn"):
    assert attention_lib.implementation(dataclasses.replace(cfg, attention_impl=impl)) == impl
  with pytest.raises(ValueError, match="attention_impl"):
    models.preset("nano", attention_impl="flash")
  assert transformer.full_attention is not None
