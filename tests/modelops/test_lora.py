"""LoRA adapters: identity at init, the exact low-rank update, gradients only in the adapters."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posttrain_jax import models
from posttrain_jax.modelops import lora


def _model():
  cfg = models.preset("nano", vocab_size=40)
  graphdef, params = nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0)), nnx.Param)
  return graphdef, params


def _logits(graphdef, pure, tokens):
  return nnx.merge(graphdef, pure)(tokens).logits


TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 40, (2, 7)), jnp.int32)


def test_fresh_adapters_leave_the_model_unchanged():
  graphdef, params = _model()
  cfg = lora.LoraConfig(rank=4)
  adapters = lora.init(params, cfg, jax.random.key(1))
  np.testing.assert_array_equal(
    _logits(graphdef, lora.apply(params, adapters, cfg), TOKENS),
    _logits(graphdef, params.to_pure_dict(), TOKENS),
  )
  # Untargeted leaves are the base arrays themselves (no copy of the base).
  pure = params.to_pure_dict()
  out = lora.apply(pure, {"q": adapters["q"]}, lora.LoraConfig(rank=4, targets=("q",)))
  assert out["layers"]["k"] is pure["layers"]["k"] and out["embed"] is pure["embed"]


def test_update_is_scaled_low_rank_product():
  _, params = _model()
  cfg = lora.LoraConfig(rank=3, alpha=6.0, targets=("q", "o", "down"))
  rng = np.random.default_rng(2)
  adapters = jax.tree.map(
    lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32),
    lora.init(params, cfg, jax.random.key(0)),
  )
  out = lora.apply(params, adapters, cfg)
  base = params.to_pure_dict()["layers"]
  for name in cfg.targets:
    w = np.asarray(base[name])
    a, b = np.asarray(adapters[name]["a"]), np.asarray(adapters[name]["b"])
    for layer in range(w.shape[0]):  # numpy loop reference, per layer
      expected = w[layer] + 2.0 * (a[layer] @ b[layer]).reshape(w.shape[1:])
      np.testing.assert_allclose(out["layers"][name][layer], expected, rtol=1e-5, atol=1e-6)
  assert lora.num_params(adapters) == sum(x.size for x in jax.tree.leaves(adapters))


def test_gradient_reaches_only_adapters_and_matches_finite_differences():
  graphdef, params = _model()
  cfg = lora.LoraConfig(rank=2, targets=("v", "up"))
  adapters = lora.init(params, cfg, jax.random.key(3))
  adapters["v"]["b"] = adapters["v"]["b"] + 0.05  # away from b = 0, so both factors get grads

  def loss(ad):
    logits = _logits(graphdef, lora.apply(params, ad, cfg), TOKENS)
    return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

  grads = jax.grad(loss)(adapters)
  assert set(grads) == {"v", "up"}
  for g in jax.tree.leaves(grads):
    assert np.all(np.isfinite(g))
  assert np.abs(grads["up"]["b"]).max() > 0 and np.abs(grads["v"]["a"]).max() > 0
  eps = 1e-3
  for name, part, idx in (("v", "a", (1, 3, 0)), ("up", "b", (0, 1, 5))):
    plus, minus = (jax.tree.map(lambda x: x, adapters) for _ in range(2))
    plus[name][part] = plus[name][part].at[idx].add(eps)
    minus[name][part] = minus[name][part].at[idx].add(-eps)
    fd = (loss(plus) - loss(minus)) / (2 * eps)
    np.testing.assert_allclose(grads[name][part][idx], fd, rtol=2e-2, atol=1e-6)


def test_merge_equals_apply_and_bad_config_errors():
  graphdef, params = _model()
  cfg = lora.LoraConfig(rank=2)
  adapters = jax.tree.map(lambda x: x + 0.01, lora.init(params, cfg, jax.random.key(4)))
  merged = lora.merge(params, adapters, cfg)
  np.testing.assert_allclose(
    _logits(graphdef, merged, TOKENS),
    _logits(graphdef, lora.apply(params, adapters, cfg), TOKENS),
    rtol=1e-6,
    atol=1e-6,
  )
  with pytest.raises(ValueError, match="valid targets"):
    lora.LoraConfig(targets=("qq",))
  with pytest.raises(ValueError, match="rank"):
    lora.LoraConfig(rank=0)
