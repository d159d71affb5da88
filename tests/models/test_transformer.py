import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posttrain_jax import models, parallel

VARIANTS = {
  "llama": dict(),
  "qwen2": dict(qkv_bias=True),
  "qwen3": dict(qk_norm=True, head_dim=24, tie_embeddings=False),
}


def _model(preset="nano", **kw):
  cfg = models.preset(preset, vocab_size=23, **kw)
  return models.Decoder(cfg, rngs=nnx.Rngs(0))


def _tokens(b=3, t=9, seed=1):
  return jax.random.randint(jax.random.key(seed), (b, t), 3, 23)


def test_tiny_preset_is_about_one_million_parameters():
  m = _model("tiny")
  n = sum(x.size for x in jax.tree.leaves(nnx.state(m, nnx.Param)))
  assert n == m.config.num_params()
  assert 0.9e6 < n < 1.1e6


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_shapes_and_hidden_states(variant):
  m = _model(**VARIANTS[variant])
  out = m(_tokens(), return_hidden_states=True)
  assert out.logits.shape == (3, 9, 23) and out.logits.dtype == jnp.float32
  assert out.hidden_states.shape == (m.config.num_layers + 1, 3, 9, m.config.hidden_size)
  assert out.cache is None


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_causal_masking(variant):
  m = _model(**VARIANTS[variant])
  toks = _tokens()
  changed = toks.at[:, 6:].set(5)
  a, b = m(toks).logits, m(changed).logits
  np.testing.assert_allclose(a[:, :6], b[:, :6], atol=1e-6)
  assert not np.allclose(a[:, 6:], b[:, 6:])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_cached_decoding_equals_full_forward(variant):
  m = _model(**VARIANTS[variant])
  toks = _tokens(t=12)
  full = m(toks).logits
  cache = models.init_cache(m.config, 3, 16)
  out = m(toks[:, :5], cache=cache)
  pieces, cache = [out.logits], out.cache
  for t in range(5, 12):
    out = m(toks[:, t : t + 1], cache=cache)
    pieces.append(out.logits)
    cache = out.cache
  np.testing.assert_allclose(jnp.concatenate(pieces, 1), full, atol=2e-5)
  assert int(cache.index) == 12


def test_left_padding_is_invisible():
  m = _model(**VARIANTS["qwen3"])
  toks = _tokens(b=1, t=6)
  padded = jnp.concatenate([jnp.zeros((1, 4), jnp.int32), toks], axis=1)
  a = m(toks).logits
  b = m(padded, start=jnp.array([4])).logits[:, 4:]
  np.testing.assert_allclose(a, b, atol=2e-5)


@pytest.mark.parametrize("variant", sorted(VARIANTS) + ["tiny", "moe"])
def test_init_decoder_is_the_eager_build_in_one_program(variant):
  """init_decoder: one lowered program (an eager build lowers one per initializer), and the
  same graph, axis names and parameters (bit for bit: the published runs' seeds reproduce) as
  building the module eagerly."""
  if variant == "tiny":
    cfg = models.preset("tiny", vocab_size=29)
  elif variant == "moe":
    cfg = models.preset("nano", vocab_size=29, num_experts=4, moe_intermediate_size=48)
  else:
    cfg = models.preset("nano", vocab_size=29, **VARIANTS[variant])
  lowered = []
  listener = lambda event, duration, **_: (
    lowered.append(event) if event == ("/jax/core/compile/jaxpr_to_mlir_module_duration") else None
  )
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    graphdef, params = models.init_decoder(cfg, 5)
  finally:
    from jax._src import monitoring  # pylint: disable=import-outside-toplevel

    monitoring.unregister_event_duration_listener(listener)
  assert len(lowered) == 1
  eager_graphdef, eager = nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(params=5)))
  assert graphdef == eager_graphdef
  assert jax.tree.structure(params) == jax.tree.structure(eager)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(eager)):
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # bit for bit
  axes = lambda state: [
    v.get_metadata()["out_sharding"]
    for v in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable))
  ]
  assert axes(params) == axes(eager)
  other = models.init_decoder(cfg, 6)[1]
  assert not np.allclose(np.asarray(other["embed"][...]), np.asarray(params["embed"][...]))


def test_every_parameter_has_logical_axes():
  m = _model("tiny", qkv_bias=True, qk_norm=True, tie_embeddings=False)
  params = nnx.state(m, nnx.Param)
  for path, var in jax.tree_util.tree_leaves_with_path(
    params, is_leaf=lambda x: isinstance(x, nnx.Variable)
  ):
    names = var.get_metadata()["out_sharding"]
    assert len(names) == var[...].ndim, path
    assert set(names) <= set(parallel.LOGICAL_AXES), (path, names)


def test_bfloat16_compute_keeps_float32_logits():
  m = _model(dtype="bfloat16")
  out = m(_tokens())
  assert out.logits.dtype == jnp.float32
  ref = _model()(_tokens()).logits
  np.testing.assert_allclose(out.logits, ref, atol=0.1)


def test_bad_preset_and_field():
  with pytest.raises(ValueError, match="valid presets"):
    models.preset("gigantic")
  with pytest.raises(ValueError, match="unknown model field"):
    models.preset("tiny", widht=3)


def test_gather_logprobs():
  logits = jax.random.normal(jax.random.key(0), (2, 3, 7))
  targets = jnp.array([[0, 1, 2], [6, 5, 4]])
  ref = jax.nn.log_softmax(logits)[jnp.arange(2)[:, None], jnp.arange(3)[None], targets]
  np.testing.assert_allclose(models.gather_logprobs(logits, targets), ref, atol=1e-6)


def test_gather_logprobs_gradient_is_dense_softmax_form():
  """d/dlogits of log softmax(logits)[t] = onehot(t) - softmax(logits) (no scatter needed)."""
  logits = jax.random.normal(jax.random.key(1), (2, 3, 7))
  targets = jnp.array([[0, 1, 1], [6, 6, 4]])
  g = jax.grad(lambda x: models.gather_logprobs(x, targets).sum())(logits)
  want = jax.nn.one_hot(targets, 7) - jax.nn.softmax(logits)
  np.testing.assert_allclose(g, want, atol=1e-6)


def test_value_head_output_dim():
  m = _model(output_dim=1)
  assert m(_tokens()).logits.shape == (3, 9, 1)
  assert m.lm_head is not None and m.config.num_params() == sum(
    x.size for x in jax.tree.leaves(nnx.state(m, nnx.Param))
  )


@pytest.mark.parametrize(
  "option, value", [("remat", True), ("unroll_layers", True), ("causal_block", 4)]
)
def test_execution_options_give_the_same_loss_and_gradients(option, value):
  """remat, unroll_layers and causal_block change how the forward runs, not what it
  computes."""
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 32, (2, 9)), jnp.int32)

  def grads(on):
    model = models.Decoder(models.preset("nano", **{option: value if on else 0}), rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(p):
      logits = nnx.merge(graphdef, p)(tokens).logits
      return jnp.mean(models.gather_logprobs(logits[:, :-1], tokens[:, 1:]))

    return jax.jit(jax.value_and_grad(loss))(params)

  (l0, g0), (l1, g1) = grads(False), grads(True)
  np.testing.assert_allclose(l0, l1, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6)  # recompute order: f32 rounding


def test_dense_equals_einsum_and_its_gradient():
  from posttrain_jax.models.ops import dense

  k1, k2 = jax.random.split(jax.random.key(3))
  x = jax.random.normal(k1, (2, 3, 4, 5))
  w = jax.random.normal(k2, (4, 5, 6))
  np.testing.assert_allclose(
    dense(x, w, 2), jnp.einsum("btnh,nhd->btd", x, w), rtol=1e-5, atol=1e-5
  )
  w1 = w.reshape(4, 30)[:, :7].reshape(4, 7)
  x1 = x[..., 0]
  g = jax.grad(lambda a, b: jnp.sum(jnp.sin(dense(a, b))), argnums=(0, 1))(x1, w1)
  ref = jax.grad(lambda a, b: jnp.sum(jnp.sin(jnp.einsum("btd,df->btf", a, b))), argnums=(0, 1))(
    x1, w1
  )
  for a, b in zip(g, ref):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="contracted"):
    dense(x, w, 1)


def test_dense_bfloat16_accumulates_in_float32_forward_and_backward():
  """bf16 operands: the products accumulate in float32 and round once to bf16 (forward and both
  gradients); float32 operands take the plain matmul, bit for bit."""
  from posttrain_jax.models import ops

  kx, kw, kg = jax.random.split(jax.random.key(4), 3)
  x = jax.random.normal(kx, (2, 5, 64))
  w = jax.random.normal(kw, (64, 3, 8)) * 0.1
  np.testing.assert_array_equal(
    ops.dense(x, w), (x.reshape(10, 64) @ w.reshape(64, 24)).reshape(2, 5, 3, 8)
  )
  xb, wb = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
  y = ops.dense(xb, wb)
  assert y.dtype == jnp.bfloat16
  # The reference: exact products of the bf16 values, accumulated in float32, rounded once.
  ref = jnp.einsum(
    "btd,dhk->bthk", xb.astype(jnp.float32), wb.astype(jnp.float32), precision="highest"
  ).astype(jnp.bfloat16)
  np.testing.assert_allclose(y.astype(jnp.float32), ref.astype(jnp.float32), rtol=1e-2, atol=1e-2)
  g = jax.random.normal(kg, y.shape).astype(jnp.bfloat16)
  gx, gw = jax.grad(
    lambda a, b: jnp.vdot(ops.dense(a, b).astype(jnp.float32), g.astype(jnp.float32)),
    argnums=(0, 1),
  )(xb, wb)
  assert gx.dtype == gw.dtype == jnp.bfloat16
  f32 = lambda a: a.astype(jnp.float32)
  gx_ref, gw_ref = jax.grad(
    lambda a, b: jnp.vdot(jnp.einsum("btd,dhk->bthk", a, b, precision="highest"), f32(g)),
    argnums=(0, 1),
  )(f32(xb), f32(wb))
  np.testing.assert_allclose(f32(gx), gx_ref, rtol=2e-2, atol=2e-2)
  np.testing.assert_allclose(f32(gw), gw_ref, rtol=2e-2, atol=2e-2)
  jitted = jax.jit(
    jax.grad(lambda a, b: ops.dense(a, b).astype(jnp.float32).sum(), argnums=(0, 1))
  )(xb, wb)
  eager = jax.grad(lambda a, b: ops.dense(a, b).astype(jnp.float32).sum(), argnums=(0, 1))(xb, wb)
  for a, b in zip(jitted, eager):
    np.testing.assert_array_equal(f32(a), f32(b))
