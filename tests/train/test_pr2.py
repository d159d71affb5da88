"""PR2, predictive routing replay (methods_B.md section 3 (d); methods/pr2/).

Unit tests: a selection shift routes to ``TopK(x (W + M))`` with gates from the unshifted
router (or the shifted one under ``shift_gates``), gates sum to one over the route, a zero
shift is no shift; the sampler records the shifted routes and replaying them gives the
behaviour log-probs; replayed indices are used bit-identically; the gradient reaches only the
experts in the route; the predictor's loss equals a numpy reference and falls on a drifting
router ``g_t = g_0 + t Delta`` until it recovers ``K Delta``. Runs (nano_moe): PR2 with
``f_phi = 0`` until its first fit equals R3 record for record, then routes ahead of the
rollout router; the config checks.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import rl_fixtures as fx
from flax import nnx

from posttrain_jax import models, rollout
from posttrain_jax.methods import validate
from posttrain_jax.objectives import route_prediction as rp
from posttrain_jax.train import updates
from posttrain_jax.train.validate import ConfigError

EOF_ID, PAD, V = 1, 0, 19


def _route(shift=None, gates=False, seed=0):
  kx, kw, ks = jax.random.split(jax.random.key(seed), 3)
  x = jax.random.normal(kx, (2, 5, 16))
  w = jax.random.normal(kw, (16, 8))
  m = None if shift is None else shift * jax.random.normal(ks, (16, 8))
  r = models.moe.route(x, w, top_k=2, norm_topk_prob=True, shift=m, shift_gates=gates)
  return x, w, m, r


def test_shift_selects_topk_of_shifted_logits_with_router_gates():
  x, w, m, r = _route(shift=1.0)
  g, g_hat = np.asarray(x @ w), np.asarray(x @ (w + m))
  want = np.sort(np.argsort(-g_hat, axis=-1)[..., :2], -1)
  np.testing.assert_array_equal(np.sort(np.asarray(r.experts), -1), want)
  assert (np.sort(np.argsort(-g, -1)[..., :2], -1) != want).any()  # the shift changed routes
  picked = np.take_along_axis(g, np.asarray(r.experts), -1)
  gates = np.exp(picked - picked.max(-1, keepdims=True))
  np.testing.assert_allclose(r.gates, gates / gates.sum(-1, keepdims=True), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(r.gates).sum(-1), 1.0, rtol=1e-6)
  # shift_gates: the same experts, gates from the shifted logits
  _, _, _, rs = _route(shift=1.0, gates=True)
  np.testing.assert_array_equal(rs.experts, r.experts)
  picked = np.take_along_axis(g_hat, np.asarray(r.experts), -1)
  gates = np.exp(picked - picked.max(-1, keepdims=True))
  np.testing.assert_allclose(rs.gates, gates / gates.sum(-1, keepdims=True), rtol=1e-5)
  # a zero shift is no shift
  _, _, _, r0 = _route(shift=0.0)
  _, _, _, plain = _route()
  for a, b in zip(r0, plain):
    np.testing.assert_array_equal(a, b)


@pytest.fixture(scope="module")
def moe():
  cfg = models.preset("nano_moe", vocab_size=V)
  graphdef, params = nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0)))
  tokens, mask = rollout.left_pad([[5, 6, 7], [8, 9, 10, 11, 12, 13], [4], [2, 3]], PAD)
  shift = 0.5 * jax.random.normal(
    jax.random.key(1), (cfg.num_layers, cfg.hidden_size, cfg.num_experts)
  )
  return cfg, graphdef, params, jnp.asarray(tokens), jnp.asarray(mask), shift


def test_sampler_records_shifted_routes_and_replay_gives_behaviour_logprobs(moe):
  cfg, graphdef, params, tokens, mask, shift = moe
  T = 6
  sc = rollout.SamplerConfig(max_new_tokens=T, eos_id=EOF_ID, pad_id=PAD, record_routing=True)
  ro = rollout.make_sampler(graphdef, sc)(
    params, tokens, mask, jax.random.key(3), route_shift=shift
  )
  S = tokens.shape[1]
  model = nnx.merge(graphdef, params)
  full = model(ro.tokens, start=ro.start, route_shift=shift, return_routing=True).routing
  plain = model(ro.tokens, start=ro.start, return_routing=True).routing
  routes, full, plain = (
    np.asarray(a) for a in (ro.routes, jnp.swapaxes(full, 0, 1), jnp.swapaxes(plain, 0, 1))
  )
  position = np.arange(S + T)
  real = (position[None] >= np.asarray(ro.start)[:, None]) & (
    position[None] < S + np.asarray(ro.lengths)[:, None] - 1
  )
  sel = np.broadcast_to(real[:, None, :, None], routes.shape)
  np.testing.assert_array_equal(np.sort(routes, -1)[sel], np.sort(full, -1)[sel])
  assert (np.sort(routes, -1)[sel] != np.sort(plain, -1)[sel]).any()
  # The update replays them without a shift: the gates are the router's, so the trainer's
  # log-probs equal the behaviour ones (ratio 1 at the first update, as R3).
  replayed = updates.make_logprob_fn(graphdef, S, 1.0)(params, ro.tokens, ro.start, ro.routes)
  np.testing.assert_allclose(replayed * ro.completion_mask, ro.logprobs, atol=1e-5)
  # shift_gates: the behaviour log-probs are the shifted router's, which a replay does not give
  sg = rollout.make_sampler(graphdef, sc.__class__(**{**sc.__dict__, "shift_gates": True}))
  ro2 = sg(params, tokens, mask, jax.random.key(3), route_shift=shift)
  again = updates.make_logprob_fn(graphdef, S, 1.0)(params, ro2.tokens, ro2.start, ro2.routes)
  assert np.abs(np.asarray(again * ro2.completion_mask) - np.asarray(ro2.logprobs)).max() > 1e-4


def test_replayed_indices_bit_identical_and_gradient_only_to_routed_experts(moe):
  cfg, graphdef, params, tokens, mask, shift = moe
  model = nnx.merge(graphdef, params)
  L, k, E = cfg.num_layers, cfg.num_experts_per_tok, cfg.num_experts
  B, T = tokens.shape
  # A route set no router would pick: experts 0 and 1 everywhere in layer 0, 6 and 7 in layer 1.
  S = np.zeros((L, B, T, k), np.int32)
  S[0] = [0, 1]
  S[1] = [6, 7]
  out = model(tokens, routing=jnp.asarray(S), return_routing=True)
  np.testing.assert_array_equal(np.asarray(out.routing), S)

  def loss(p):
    return jnp.sum(nnx.merge(graphdef, p)(tokens, routing=jnp.asarray(S)).logits ** 2)

  grads = jax.grad(loss)(params)
  for name in ("experts_gate", "experts_up", "experts_down"):
    g = np.abs(np.asarray(grads["layers"][name][...]))
    per_expert = g.reshape(L, E, -1).sum(-1)
    for layer, used in ((0, {0, 1}), (1, {6, 7})):
      for e in range(E):
        assert (per_expert[layer, e] > 0) == (e in used), (name, layer, e)


def test_predictor_loss_matches_numpy():
  L, N, D, E, r = 2, 7, 5, 4, 3
  ks = jax.random.split(jax.random.key(0), 5)
  p = rp.Predictor(jax.random.normal(ks[0], (L, D, r)), jax.random.normal(ks[1], (L, r, E)))
  x = jax.random.normal(ks[2], (L, N, D))
  g_old, g_new = jax.random.normal(ks[3], (L, N, E)), jax.random.normal(ks[4], (L, N, E))
  mask = jnp.asarray([1, 1, 0, 1, 1, 0, 1], jnp.float32)
  xn, go, gn, m = (np.asarray(a, np.float64) for a in (x, g_old, g_new, mask))
  M = np.einsum("ldr,lre->lde", np.asarray(p.down), np.asarray(p.up))
  pred = go + np.einsum("lnd,lde->lne", xn, M)
  mse = ((pred - gn) ** 2).mean(-1).mean(0)
  np.testing.assert_allclose(
    rp.loss(p, x, g_old, g_new, mask), (mse * m).sum() / m.sum(), rtol=1e-5
  )
  lq = pred - np.log(np.exp(pred).sum(-1, keepdims=True))
  lp = gn - np.log(np.exp(gn).sum(-1, keepdims=True))
  kl = (np.exp(lp) * (lp - lq)).sum(-1).mean(0)
  np.testing.assert_allclose(
    rp.loss(p, x, g_old, g_new, mask, "kl"), (kl * m).sum() / m.sum(), rtol=1e-5
  )
  with pytest.raises(ValueError, match="unknown route-predictor loss"):
    rp.loss(p, x, g_old, g_new, mask, "l1")


def test_predictor_learns_a_drifting_router():
  """``g_t = x (W_0 + t Delta)``: fitted on pairs K apart, the predictor's shift approaches
  ``K Delta`` (rank(Delta) <= r), and its top-k overlap with the router K steps ahead beats
  the unchanged router's."""
  L, N, D, E, r, K = 1, 256, 12, 8, 4, 2
  kw, kd, kx, ku, kv = jax.random.split(jax.random.key(0), 5)
  W0 = jax.random.normal(kw, (L, D, E))
  delta = 0.3 * jnp.einsum(
    "ldr,lre->lde", jax.random.normal(ku, (L, D, 2)), jax.random.normal(kv, (L, 2, E))
  )
  pred = rp.init(kd, L, D, E, r)
  tx = optax.adam(0.05)
  opt = tx.init(pred)
  np.testing.assert_array_equal(rp.shift(pred), 0.0)  # f_phi = 0 at the start
  mask = jnp.ones((N,))
  losses = []
  for t in range(30):
    x = jax.random.normal(jax.random.fold_in(kx, t), (L, N, D))
    g_old = jnp.einsum("lnd,lde->lne", x, W0 + t * delta)
    g_new = jnp.einsum("lnd,lde->lne", x, W0 + (t + K) * delta)
    pred, opt, m = rp.fit(pred, opt, tx, x, g_old, g_new, mask, steps=10)
    losses.append(float(m["loss_before"]))
  assert losses[-1] < 0.01 * losses[0]
  np.testing.assert_allclose(rp.shift(pred), K * delta, atol=0.05 * float(jnp.abs(K * delta).max()))
  x = jax.random.normal(jax.random.key(9), (L, N, D))
  g_now = jnp.einsum("lnd,lde->lne", x, W0 + 30 * delta)
  g_ahead = jnp.einsum("lnd,lde->lne", x, W0 + (30 + K) * delta)
  ahead = rp.topk_overlap(rp.predicted_logits(pred, x, g_now), g_ahead, 2)
  assert ahead > rp.topk_overlap(g_now, g_ahead, 2) and ahead > 0.97


def _run(tmp_path, name, steps, **pr2):
  c = fx.smoke_config(steps)
  c.model.preset = "nano_moe"
  c.rl.routing_replay = True
  if pr2:
    c.rl.pr2.update(enabled=True, **pr2)
  return fx.run(tmp_path / name, c)


def test_pr2_is_r3_until_its_first_fit_then_routes_ahead(tmp_path):
  """horizon 1: the step-1 rows are cached after its update, the predictor is fitted after
  step 2's, so steps 1-2 sample with f_phi = 0 and equal R3's records exactly; step 3 routes
  by the prediction, so its rollout's experts differ from the behaviour router's own."""
  r3 = _run(tmp_path, "r3", 3)
  pr2 = _run(tmp_path, "pr2", 3, horizon=1, lr=0.05)
  for a, b in zip(r3[:2], pr2[:2]):
    for key in a:
      if not key.startswith("time/"):
        assert a[key] == b[key], key
  assert "pr2/drift" not in pr2[0] and pr2[1]["pr2/drift"] > 0
  assert pr2[1]["pr2/loss_after"] < pr2[1]["pr2/loss_before"]
  assert r3[2]["moe/routing_overlap"] == 1.0 and pr2[2]["moe/routing_overlap"] < 1.0
  assert abs(pr2[2]["mismatch/k3"]) < 1e-5  # gates from the rollout router: still ratio 1


def test_pr2_config_checks():
  c = fx.smoke_config(2)
  c.model.preset = "nano_moe"
  c.rl.pr2.enabled = True
  with pytest.raises(ConfigError, match="routing_replay=True"):
    validate(c)
  c.rl.routing_replay = True
  c.rl.pr2.loss = "l1"
  with pytest.raises(ConfigError, match="config.rl.pr2.loss='l1'"):
    validate(c)
  c.rl.pr2.loss = "kl"
  validate(c)
