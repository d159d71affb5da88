"""Mixture-of-experts decoder: routing, gates, load-balancing loss, routing record and replay.

Models are built abstractly and filled from numpy, and every forward goes through one jitted
function that always takes a routing array (``-1`` = route afresh), so the file compiles a
handful of programs (2 CPU cores).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posttrain_jax import models
from posttrain_jax.models import moe

V = 23


def _abstract(preset="nano_moe", **kw):
  cfg = models.preset(preset, vocab_size=V, **kw)
  return nnx.eval_shape(lambda: models.Decoder(cfg, rngs=nnx.Rngs(0)))


def _model(seed=0, **kw) -> models.Decoder:
  """A Decoder with every parameter random (filled from numpy: fast)."""
  graphdef, state = nnx.split(_abstract(**kw))
  rng = np.random.default_rng(seed)
  for path, var in nnx.to_flat_state(state):
    shape, dtype = var.get_value().shape, var.get_value().dtype
    base = 1.0 if "norm" in str(path[-1]) else 0.0
    var.set_value(jnp.asarray(base + 0.3 * rng.standard_normal(shape), dtype))
  return nnx.merge(graphdef, state)


def _tokens(b=3, t=9, seed=1):
  return jax.random.randint(jax.random.key(seed), (b, t), 0, V)


@functools.partial(jax.jit, static_argnums=0)
def _jit_forward(graphdef, params, tokens, routing, start, cache):
  return nnx.merge(graphdef, params)(
    tokens, routing=routing, start=start, cache=cache, return_routing=True
  )


def fwd(model, tokens, routing=None, start=None, cache=None):
  """``model(tokens, routing=..., return_routing=True)``, jitted; no routing = all -1."""
  c = model.config
  B, T = tokens.shape
  if routing is None:
    routing = jnp.full((c.num_layers, B, T, c.num_experts_per_tok), -1, jnp.int32)
  if start is None:
    start = jnp.zeros((B,), jnp.int32) if cache is None else cache.start
  graphdef, params = nnx.split(model)
  return _jit_forward(graphdef, params, tokens, routing, start, cache)


@pytest.fixture(scope="module")
def model():
  return _model()


def test_dense_default_and_config_checks():
  assert models.ModelConfig().num_experts == 0
  m = _abstract("nano")
  assert m.layers.router is None and m.layers.gate is not None
  out = nnx.eval_shape(lambda m: m(_tokens(), return_routing=True), m)
  assert out.aux_loss is None and out.routing is None
  logits, cache, hidden = out[:3]  # the first three fields are unchanged
  assert cache is None and hidden is None and logits.shape == (3, 9, V)
  with pytest.raises(ValueError, match="needs a mixture-of-experts model"):
    nnx.eval_shape(lambda m: m(_tokens(), routing=jnp.zeros((2, 3, 9, 2), jnp.int32)), m)
  with pytest.raises(ValueError, match="num_experts_per_tok=5"):
    models.preset("nano", num_experts=4, num_experts_per_tok=5)
  with pytest.raises(ValueError, match="shared_expert_intermediate_size"):
    models.preset("nano", shared_expert_intermediate_size=8)


@pytest.mark.parametrize("kw", [dict(), dict(shared_expert_intermediate_size=24)])
def test_parameter_count_and_logical_axes(kw):
  m = _abstract(**kw)
  params = nnx.state(m, nnx.Param)
  assert sum(x.size for x in jax.tree.leaves(params)) == m.config.num_params()
  assert m.layers.gate is None
  L, D, E, F = 2, 64, 8, 64
  assert m.layers.router.get_value().shape == (L, D, E)
  assert m.layers.experts_gate.get_value().shape == (L, E, D, F)
  assert m.layers.experts_down.get_value().shape == (L, E, F, D)
  assert m.layers.experts_up.get_metadata()["out_sharding"] == ("layers", "expert", "embed", "mlp")
  assert (m.layers.shared_gate is None) == (not kw)


def test_route_gates():
  x = jax.random.normal(jax.random.key(0), (2, 5, 8))
  w = jax.random.normal(jax.random.key(1), (8, 6))
  logits = jnp.einsum("btd,de->bte", x, w)
  raw = moe.route(x, w, top_k=3, norm_topk_prob=False)
  np.testing.assert_array_equal(raw.experts, jax.lax.top_k(logits, 3)[1])
  np.testing.assert_allclose(
    raw.gates, jnp.take_along_axis(jax.nn.softmax(logits), raw.experts, -1), rtol=1e-6
  )
  # Renormalised gates are the softmax over the routed logits, also for a replayed route.
  replay = jnp.broadcast_to(jnp.array([5, 0, 2]), (2, 5, 3))
  for experts in (None, replay):
    r = moe.route(x, w, top_k=3, norm_topk_prob=True, replay=experts)
    want = jax.nn.softmax(jnp.take_along_axis(logits, r.experts, -1), axis=-1)
    np.testing.assert_allclose(r.gates, want, rtol=1e-5)
    np.testing.assert_allclose(r.gates.sum(-1), 1.0, rtol=1e-6)
  np.testing.assert_array_equal(r.experts, replay)
  # A row with an id outside [0, E) is routed afresh.
  partial = replay.at[0, 1].set(jnp.array([5, -1, 2]))
  r = moe.route(x, w, top_k=3, norm_topk_prob=True, replay=partial)
  np.testing.assert_array_equal(r.experts[0, 1], raw.experts[0, 1])
  np.testing.assert_array_equal(r.experts[1], replay[1])


def test_dense_expert_compute_equals_per_token_loop():
  cfg = models.preset("nano_moe", vocab_size=V, shared_expert_intermediate_size=24)
  m = _model(seed=3, shared_expert_intermediate_size=24)
  p = {k: v[0] for k, v in m.layers.stacked(jnp.float32).items()}
  x = jax.random.normal(jax.random.key(2), (2, 4, cfg.hidden_size))
  y, experts, _ = jax.jit(functools.partial(moe.moe_mlp, cfg))(p, x, mask=jnp.ones((2, 4)))
  silu = lambda z: z / (1 + np.exp(-z))  # noqa: E731
  P = {k: np.asarray(v, np.float64) for k, v in p.items()}
  for b in range(2):
    for t in range(4):
      xt = np.asarray(x[b, t], np.float64)
      logits = xt @ P["router"]
      probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
      top = np.argsort(-probs)[:2]
      assert set(top) == set(np.asarray(experts[b, t]))
      gates = probs[top] / probs[top].sum()
      want = sum(
        g * ((silu(xt @ P["experts_gate"][e]) * (xt @ P["experts_up"][e])) @ P["experts_down"][e])
        for g, e in zip(gates, top)
      )
      shared = (silu(xt @ P["shared_gate"]) * (xt @ P["shared_up"])) @ P["shared_down"]
      want = want + shared / (1 + np.exp(-(xt @ P["shared_expert_gate"])))
      np.testing.assert_allclose(np.asarray(y[b, t]), want, atol=1e-5, rtol=1e-5)


def test_replay_own_routing_is_identical_and_other_routing_changes_logits(model):
  toks = _tokens()
  out = fwd(model, toks)  # all -1: every token routed by the router
  assert out.routing.shape == (2, 3, 9, 2) and out.routing.dtype == jnp.int32
  assert out.aux_loss.shape == () and out.aux_loss.dtype == jnp.float32
  plain = model(toks)  # eager, no routing arguments: the same model
  np.testing.assert_allclose(plain.logits, out.logits, atol=1e-5)
  np.testing.assert_allclose(plain.aux_loss, out.aux_loss, rtol=1e-6)
  assert plain.routing is None
  again = fwd(model, toks, out.routing)
  np.testing.assert_array_equal(np.asarray(again.logits), np.asarray(out.logits))
  np.testing.assert_array_equal(np.asarray(again.routing), np.asarray(out.routing))
  # Change the route of the last layer from position 5 on: earlier positions are untouched.
  other = out.routing.at[1, :, 5:].set((out.routing[1, :, 5:] + 1) % 8)
  changed = fwd(model, toks, other)
  np.testing.assert_array_equal(np.asarray(changed.routing), np.asarray(other))
  np.testing.assert_allclose(changed.logits[:, :5], out.logits[:, :5], atol=1e-6)
  assert np.all(np.abs(np.asarray(changed.logits[:, 5:] - out.logits[:, 5:])).max(-1) > 1e-3)
  overlap = moe.routing_overlap(other, out.routing)
  np.testing.assert_array_equal(overlap[0], 1.0)
  assert np.all(np.asarray(overlap[1, :, 5:]) < 1) and np.all(np.asarray(overlap[1, :, :5]) == 1)
  with pytest.raises(ValueError, match=r"expected \[L, B, T, k\]"):
    nnx.eval_shape(lambda m: m(toks, routing=out.routing[:, :, :4]), model)


def test_router_gradients_under_replay(model):
  toks = _tokens()
  routing = fwd(model, toks).routing
  other = (routing + 3) % 8  # a route the router would not pick
  graphdef, params = nnx.split(model, nnx.Param)

  def loss(params, routing):
    m = nnx.merge(graphdef, params)
    out = m(toks, routing=routing)
    return models.gather_logprobs(out.logits, toks).mean() + out.aux_loss

  for r in (routing, other):
    grads = jax.jit(jax.grad(loss))(params, r)
    g = np.asarray(grads["layers"]["router"][...])
    assert np.all(np.isfinite(g)) and np.abs(g).max() > 1e-6
    for name in ("experts_gate", "experts_down"):
      ge = np.asarray(grads["layers"][name][...])  # [L, E, ...]
      used = np.zeros((2, 8), bool)
      for layer in range(2):
        used[layer, np.unique(np.asarray(r[layer]))] = True
      norms = np.abs(ge).reshape(2, 8, -1).max(-1)
      assert np.all(norms[~used] == 0) and np.all(norms[used] > 0)


def test_cached_decoding_returns_each_steps_routing_and_replays(model):
  toks = _tokens()
  full = fwd(model, toks)
  other = (full.routing + 1) % 8
  want = fwd(model, toks, other)

  def decode(routing):
    cache = models.init_cache(model.config, 3, 12)
    out = fwd(model, toks[:, :4], routing[:, :, :4], cache=cache)
    logits, routes, cache = [out.logits], [out.routing], out.cache
    for t in range(4, 9):
      out = fwd(model, toks[:, t : t + 1], routing[:, :, t : t + 1], cache=cache)
      logits.append(out.logits)
      routes.append(out.routing)
      cache = out.cache
    return jnp.concatenate(logits, 1), jnp.concatenate(routes, 2)

  logits, routes = decode(jnp.full_like(other, -1))
  np.testing.assert_allclose(logits, full.logits, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(routes, full.routing)
  # Replaying a different route step by step equals the full forward under that replay.
  logits, routes = decode(other)
  np.testing.assert_allclose(logits, want.logits, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(routes, other)


def test_load_balancing_loss():
  toks = _tokens()
  # A zero router is uniform: f puts k tokens' worth on experts 0..k-1, P = 1/E, aux = k.
  m = _model()
  m.layers.router[...] = jnp.zeros_like(m.layers.router[...])
  np.testing.assert_allclose(fwd(m, toks).aux_loss, 2.0, rtol=1e-6)
  # Left padding is excluded: the padding's content does not change the loss (it does when
  # the same positions are counted as real).
  m = _model()
  start = jnp.array([3, 0, 5], jnp.int32)
  other = toks.at[0, :3].set((toks[0, :3] + 7) % V).at[2, :5].set(0)
  a, b = fwd(m, toks, start=start), fwd(m, other, start=start)
  np.testing.assert_allclose(b.aux_loss, a.aux_loss, rtol=1e-6)
  np.testing.assert_allclose(b.logits[0, 3:], a.logits[0, 3:], atol=1e-5)
  zero = jnp.zeros(3, jnp.int32)
  assert abs(float(fwd(m, toks, start=zero).aux_loss - fwd(m, other, start=zero).aux_loss)) > 1e-4
  # A token mask (a trainer's completion mask: no padding after EOS) drops positions from the
  # loss: masking the last 3 equals the forward of the first 6 (causal: their routes are the
  # same); all ones is the default.
  tail = jnp.ones(toks.shape, jnp.float32).at[:, 6:].set(0.0)
  np.testing.assert_allclose(
    m(toks, start=start, token_mask=tail).aux_loss, m(toks[:, :6], start=start).aux_loss, rtol=1e-6
  )
  np.testing.assert_allclose(
    m(toks, start=start, token_mask=jnp.ones(toks.shape)).aux_loss, a.aux_loss, rtol=1e-6
  )
  assert abs(float(m(toks, start=start, token_mask=tail).aux_loss - a.aux_loss)) > 1e-5
  # Pooled over layers (Hugging Face), from explicit stats.
  stats = moe.LayerStats(
    counts=jnp.array([[2.0, 0.0], [1.0, 1.0]]),
    prob_sums=jnp.array([[0.6, 0.4], [0.5, 0.5]]),
    rows=jnp.array([2.0, 2.0]),
  )
  f, P = np.array([3.0, 1.0]) / 4, np.array([1.1, 0.9]) / 4
  np.testing.assert_allclose(moe.load_balancing_loss(stats), 2 * (f * P).sum(), rtol=1e-6)


def test_bfloat16_moe_runs_and_replays():
  m = _model(dtype="bfloat16")
  toks = _tokens()
  out = fwd(m, toks)
  assert m.layers.experts_up[...].dtype == jnp.float32  # param_dtype stays float32
  assert out.logits.dtype == jnp.float32 and np.all(np.isfinite(out.logits))
  again = fwd(m, toks, out.routing)
  np.testing.assert_array_equal(np.asarray(again.logits), np.asarray(out.logits))
