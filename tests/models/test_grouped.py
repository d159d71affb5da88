"""The shared-prompt forward (models/grouped.py, models.grouped_forward) against the reference full
forward over the concatenated rows: logits and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posttrain_jax import models

V, P, G, S, T = 23, 2, 3, 5, 4


@pytest.mark.parametrize(
  "overrides",
  [
    {},
    {"causal_block": 3, "unroll_layers": True},
    {"qk_norm": True, "qkv_bias": True, "remat": True},
  ],
)
def test_grouped_forward_equals_the_full_forward(overrides):
  cfg = models.preset("nano", vocab_size=V, **overrides)
  graphdef, params = nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0)), nnx.Param)
  rng = np.random.default_rng(0)
  prompts = jnp.asarray(rng.integers(2, V, (P, S)), jnp.int32)
  start = jnp.array([0, 2], jnp.int32)
  completions = jnp.asarray(rng.integers(2, V, (P * G, T)), jnp.int32)
  rows = jnp.concatenate([jnp.repeat(prompts, G, axis=0), completions], axis=1)
  weights = jax.random.normal(jax.random.key(1), (P * G, T + 1, V))

  def grouped(p):
    logits = models.grouped_forward(nnx.merge(graphdef, p), prompts, start, completions, G).logits
    return jnp.sum(jnp.sin(logits) * weights), logits

  def full(p):
    logits = nnx.merge(graphdef, p)(rows, start=jnp.repeat(start, G)).logits[:, S - 1 :]
    return jnp.sum(jnp.sin(logits) * weights), logits

  (l0, a), g0 = jax.jit(jax.value_and_grad(full, has_aux=True))(params)
  (l1, b), g1 = jax.jit(jax.value_and_grad(grouped, has_aux=True))(params)
  assert b.shape == (P * G, T + 1, V)
  np.testing.assert_allclose(b, a, atol=2e-5)
  np.testing.assert_allclose(l1, l0, rtol=1e-5)
  for x, y in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=5e-5)


def test_grouped_forward_refuses_bad_layouts_and_moe():
  m = models.Decoder(models.preset("nano", vocab_size=V), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="not 2 per each"):
    models.grouped_forward(
      m, jnp.zeros((2, 3), jnp.int32), jnp.zeros(2), jnp.zeros((5, 2), jnp.int32), 2
    )
  moe = models.Decoder(models.preset("nano_moe", vocab_size=V), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="dense models only"):
    models.grouped_forward(
      moe, jnp.zeros((2, 3), jnp.int32), jnp.zeros(2), jnp.zeros((4, 2), jnp.int32), 2
    )
