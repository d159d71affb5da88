"""Plasticity diagnostics (analysis/plasticity.py) against hand computations, and the
top-changed-neuron overlap (modelops/neurons.py) on planted changes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posttrain_jax import models
from posttrain_jax.analysis import plasticity
from posttrain_jax.modelops import neurons
from posttrain_jax.models import transformer as tf

V = 17


@pytest.fixture(scope="module")
def model():
  graphdef, params = nnx.split(
    models.Decoder(models.preset("nano", vocab_size=V), rngs=nnx.Rngs(0))
  )
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(2, V, (6, 10)), jnp.int32)
  mask = jnp.asarray((np.arange(10) >= 5)[None].repeat(6, 0), jnp.float32).at[0, 9].set(0.0)
  return graphdef, params, tokens, mask


def _np_probs(graphdef, params, tokens):
  logits = np.asarray(nnx.merge(graphdef, params)(tokens[:, :-1]).logits, np.float64)
  z = logits - logits.max(-1, keepdims=True)
  return np.exp(z) / np.exp(z).sum(-1, keepdims=True)


def test_confidence_and_nll_match_a_hand_computation(model):
  graphdef, params, tokens, mask = model
  p = _np_probs(graphdef, params, tokens)
  m = np.asarray(mask)[:, 1:] > 0
  toks = np.asarray(tokens)[:, 1:]
  got = plasticity.confidence(graphdef, params, tokens, mask)
  np.testing.assert_allclose(float(got["max_prob"]), p.max(-1)[m].mean(), rtol=1e-5)
  ent = -(p * np.log(p)).sum(-1)
  np.testing.assert_allclose(float(got["entropy"]), ent[m].mean(), rtol=1e-5)
  nll = -np.log(np.take_along_axis(p, toks[..., None], -1)[..., 0])[m].mean()
  np.testing.assert_allclose(float(plasticity.nll(graphdef, params, tokens, mask)), nll, rtol=1e-5)


def test_sharpness_is_the_loss_after_one_normalised_ascent_step(model):
  graphdef, params, tokens, mask = model
  out = plasticity.sharpness(graphdef, params, tokens, mask, rho=0.05)
  g = plasticity.grad(graphdef, params, tokens, mask)
  norm = float(plasticity.global_norm(g))
  moved = jax.tree.map(lambda x, d: x + 0.05 / norm * d, params, g)
  want = float(plasticity.nll(graphdef, moved, tokens, mask) - out["loss"])
  np.testing.assert_allclose(float(out["sharpness"]), want, rtol=1e-4)
  # first order: L(theta + rho g/|g|) - L(theta) ~ rho |g| for a small radius
  small = plasticity.sharpness(graphdef, params, tokens, mask, rho=1e-3)
  np.testing.assert_allclose(float(small["sharpness"]), 1e-3 * norm, rtol=0.05)
  with pytest.raises(ValueError, match="rho > 0"):
    plasticity.sharpness(graphdef, params, tokens, mask, rho=0.0)


def test_cosines_overall_and_per_module(model):
  graphdef, params, tokens, mask = model
  g = plasticity.grad(graphdef, params, tokens, mask)
  same = plasticity.cosines(g, g)
  assert same["all"] == pytest.approx(1.0) and "layers/gate" in same
  assert all(v == pytest.approx(1.0) or v == 0.0 for v in same.values())
  opposite = plasticity.cosines(g, jax.tree.map(jnp.negative, g))
  assert opposite["all"] == pytest.approx(-1.0)
  # one module flipped: only its cosine changes sign, and the overall value follows numpy
  flip = "layers/down"
  h = jax.tree_util.tree_map_with_path(
    lambda p, x: -x if plasticity.module_name(p) == flip else x, g
  )
  mixed = plasticity.cosines(g, h)
  assert mixed[flip] == pytest.approx(-1.0) and mixed["layers/gate"] == pytest.approx(1.0)
  flat = lambda t: np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(t)])  # noqa: E731
  a, b = flat(g), flat(h)
  assert mixed["all"] == pytest.approx(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _moved(params, units, scale=1.0):
  """``params`` with the MLP neurons ``units`` (per layer index lists) shifted."""

  def move(path, x):
    name = "/".join(str(getattr(k, "key", "")) for k in path if getattr(k, "key", None))
    out = np.asarray(x).copy()
    for layer, us in enumerate(units):
      for u in us:
        if name.endswith("layers/gate") or name.endswith("layers/up"):
          out[layer, :, u] += scale
        elif name.endswith("layers/down"):
          out[layer, u, :] += scale
    return jnp.asarray(out)

  return jax.tree_util.tree_map_with_path(move, params)


def test_top_changed_overlap_on_planted_neurons(model):
  _, params, _, _ = model
  down = [x for p, x in jax.tree_util.tree_flatten_with_path(params)[0] if "down" in str(p)][0]
  layers, width = down.shape[0], down.shape[1]
  k = max(1, width // 8)
  first = [list(range(k))] * layers
  second = [list(range(k, 2 * k))] * layers
  a, b = _moved(params, first), _moved(params, first, scale=2.0)
  c = _moved(params, second)
  frac = k / width
  assert neurons.top_changed_overlap(params, a, b, frac) == 1.0
  assert neurons.top_changed_overlap(params, a, c, frac) == 0.0
  with pytest.raises(ValueError, match="selects no neuron"):
    neurons.top_changed_overlap(params, a, b, 0.0)


def test_mlp_activations_rebuild_the_residual_stream_and_a_dead_neuron_is_dormant(model):
  graphdef, params, tokens, _ = model
  m = nnx.merge(graphdef, params)
  hidden = np.asarray(m(tokens, return_hidden_states=True).hidden_states)
  act = plasticity.mlp_activations(graphdef, params, tokens)
  layers = m.layers.stacked(m.config.jnp_dtype)
  for i in range(m.config.num_layers):  # h_{l+1} = h_mid + act @ down, and mlp(h_mid) = h_{l+1}
    p = jax.tree.map(lambda x: x[i], layers)
    h_mid = hidden[i + 1] - np.asarray(act[i]) @ np.asarray(layers["down"][i])
    again = np.asarray(tf.mlp(m.config, p, jnp.asarray(h_mid)))
    np.testing.assert_allclose(again, hidden[i + 1], rtol=2e-4, atol=2e-5)
  zeroed = jax.tree_util.tree_map_with_path(
    lambda p, x: x.at[0, :, 3].set(0.0) if "gate" in jax.tree_util.keystr(p) else x, params
  )
  scores = np.asarray(plasticity.dormancy_scores(graphdef, zeroed, tokens))
  assert scores.shape == (m.config.num_layers, act.shape[-1])
  assert scores[0, 3] == 0.0 and scores[0].mean() == pytest.approx(1.0, rel=1e-5)
  sel = np.asarray(neurons.select(-jnp.asarray(scores), 1 / act.shape[-1]))
  assert sel[0, 3] and sel.sum() == m.config.num_layers  # the dead neuron is picked first
