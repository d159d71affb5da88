"""Base-anchored fusion, sparse rollback and neuron reset (modelops.anchored, modelops.neurons):
numpy references, bit-identity of what they leave alone, function-preserving resets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posttrain_jax import modelops, models
from posttrain_jax.modelops import anchored, neurons

TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 40, (2, 7)), jnp.int32)


def _model(seed):
  cfg = models.preset("nano", vocab_size=40)
  return nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(seed)), nnx.Param)


def _pair():
  graphdef, base = _model(0)
  _, other = _model(1)
  tuned = jax.tree.map(lambda b, o: b + 0.1 * o, base, other)  # a "fine-tuned" copy
  return graphdef, base, tuned


def _named(tree) -> dict:
  return {
    anchored.leaf_name(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def _logits(graphdef, params):
  return np.asarray(nnx.merge(graphdef, params)(TOKENS).logits)


def test_fuse_matches_numpy_per_module_and_per_layer():
  _, base, tuned = _pair()
  got = _named(anchored.fuse([base, tuned], alpha=0.3, modules={"down": 0.0, "embed": 1.0}))
  b, t = _named(base), _named(tuned)
  for name in b:
    a = 0.0 if name == "layers/down" else 1.0 if name == "embed" else 0.3
    want = b[name].astype(np.float64) + a * (t[name].astype(np.float64) - b[name])
    np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6)
  # α = 0 and α = 1 are the base's and the tuned model's values, bit for bit
  np.testing.assert_array_equal(got["layers/down"], b["layers/down"])
  np.testing.assert_array_equal(got["embed"], t["embed"])
  layers = t["layers/up"].shape[0]
  per_layer = [0.0] + [1.0] * (layers - 1)
  got = _named(anchored.fuse([base, tuned], layers=per_layer, modules={"up": 0.5}))
  np.testing.assert_array_equal(got["layers/gate"][0], b["layers/gate"][0])
  np.testing.assert_array_equal(got["layers/gate"][1:], t["layers/gate"][1:])
  np.testing.assert_allclose(
    got["layers/up"][1:],
    b["layers/up"][1:] + 0.5 * (t["layers/up"][1:] - b["layers/up"][1:]),
    rtol=1e-5,
  )
  np.testing.assert_array_equal(got["embed"], b["embed"] + 0.5 * (t["embed"] - b["embed"]))
  with pytest.raises(ValueError, match="layers has 1 values"):
    anchored.fuse([base, tuned], layers=(0.5,))


def test_fusing_a_model_with_itself_is_the_identity():
  _, base, _ = _pair()
  for a in (0.0, 0.37, 1.0):
    for x, y in zip(jax.tree.leaves(anchored.fuse([base, base], alpha=a)), jax.tree.leaves(base)):
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_rollback_moves_exactly_the_top_fraction_by_drift_and_nothing_else():
  _, anchor, tuned = _pair()
  total = sum(x.size for x in jax.tree.leaves(tuned))
  got = anchored.rollback([tuned, anchor], fraction=0.01)
  t, a, g = (
    np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(tree)])
    for tree in (tuned, anchor, got)
  )
  moved = g != t
  assert moved.sum() == round(0.01 * total)
  np.testing.assert_array_equal(g[moved], a[moved])  # set back to the anchor exactly
  drift = np.abs(t - a)
  assert drift[moved].min() >= drift[~moved].max()  # the largest drifts, by a numpy sort
  for x, y in zip(
    jax.tree.leaves(anchored.rollback([tuned, anchor], fraction=0.0)), jax.tree.leaves(tuned)
  ):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  back = anchored.rollback([tuned, anchor], fraction=1.0)
  for x, y in zip(jax.tree.leaves(back), jax.tree.leaves(anchor)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  rand = np.concatenate(
    [
      np.ravel(np.asarray(x))
      for x in jax.tree.leaves(anchored.rollback([tuned, anchor], fraction=0.01, score="random"))
    ]
  )
  assert (rand != t).sum() == round(0.01 * total) and drift[rand != t].mean() < drift[moved].mean()


def test_neuron_reset_reinit_preserves_the_function_and_touches_only_chosen_neurons():
  graphdef, base, tuned = _pair()
  chosen = np.asarray(neurons.select(neurons.drift_scores(tuned, base), 0.25))  # [L, F]

  def prune(path, x):  # the chosen neurons' output rows zeroed: the pruned model
    return jnp.where(chosen[:, :, None], 0.0, x) if anchored.leaf_name(path) == neurons.DOWN else x

  pruned = jax.tree_util.tree_map_with_path(prune, tuned)
  out = neurons.reset_neurons([tuned, base], fraction=0.25, score="drift", mode="reinit", seed=3)
  # the fresh input weights change nothing: the reset model is the pruned one ...
  np.testing.assert_allclose(
    _logits(graphdef, out), _logits(graphdef, pruned), rtol=1e-5, atol=1e-5
  )
  # ... and resetting neurons that were already dormant (zero output) keeps the function
  again = neurons.reset_neurons(
    [pruned, base], fraction=0.25, scores=jnp.asarray(chosen, jnp.float32), mode="reinit", seed=4
  )
  np.testing.assert_allclose(
    _logits(graphdef, again), _logits(graphdef, pruned), rtol=1e-5, atol=1e-5
  )
  assert np.abs(_logits(graphdef, out) - _logits(graphdef, tuned)).max() > 1e-3  # not vacuous
  t, o = _named(tuned), _named(out)
  assert chosen.sum(1).tolist() == [round(0.25 * chosen.shape[1])] * chosen.shape[0]
  np.testing.assert_array_equal(o["layers/down"][chosen], 0.0)
  np.testing.assert_array_equal(o["layers/down"][~chosen], t["layers/down"][~chosen])
  gate_t, gate_o = np.moveaxis(t["layers/gate"], 2, 1), np.moveaxis(o["layers/gate"], 2, 1)
  assert np.all(gate_o[chosen] != gate_t[chosen])  # fresh input weights
  np.testing.assert_array_equal(gate_o[~chosen], gate_t[~chosen])
  for name in t:
    if name not in (neurons.GATE, neurons.UP, neurons.DOWN):
      np.testing.assert_array_equal(o[name], t[name])
  # drift picks the neurons that moved most, by a numpy reference of the score
  b = _named(base)
  ref = sum(
    np.square(t[n] - b[n]).sum(axis)
    for n, axis in ((neurons.GATE, 1), (neurons.UP, 1), (neurons.DOWN, 2))
  )
  np.testing.assert_allclose(np.asarray(neurons.drift_scores(tuned, base)), ref, rtol=1e-5)


def test_neuron_reset_to_base_restores_the_chosen_neurons_exactly():
  _, base, tuned = _pair()
  out = _named(neurons.reset_neurons([tuned, base], fraction=1.0, mode="base"))
  b = _named(base)
  for n in (neurons.GATE, neurons.UP, neurons.DOWN):
    np.testing.assert_array_equal(out[n], b[n])
  with pytest.raises(ValueError, match="mode 'zero'"):
    neurons.reset_neurons([tuned, base], fraction=0.1, mode="zero")
  with pytest.raises(ValueError, match="dense decoder's stacked MLP"):
    neurons.reset_neurons([{"w": jnp.ones((2, 2))}, {"w": jnp.ones((2, 2))}], fraction=0.1)


def test_the_operators_are_registered_for_modelop_stages():
  assert modelops.MODEL_OPS["fuse"] is anchored.fuse
  assert modelops.MODEL_OPS["rollback"] is anchored.rollback
  assert modelops.MODEL_OPS["reset_neurons"] is neurons.reset_neurons
