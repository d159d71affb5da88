"""The analysis layer's pieces (analysis/representations.py, analysis/detection.py) against
independent references: difference of means recovers a planted direction; the steering hook
moves only its layer's hidden state, by exactly alpha v, and is linear in alpha; the logit lens
equals a manual norm-and-head product and, at the last layer, the model's logits; the capture
equals the model's hidden states at the asked positions; linear CKA is invariant to rotation and
scale and equals its numpy formula; AUROC equals a pairwise count and TPR at FPR a threshold
scan."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posttrain_jax import models
from posttrain_jax.analysis import detection
from posttrain_jax.analysis import representations as rep


@pytest.fixture(scope="module")
def model():
  cfg = models.preset("nano", vocab_size=23)
  graphdef, params = nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0)))
  tokens = jax.random.randint(jax.random.key(1), (3, 7), 2, 23)
  return cfg, graphdef, params, tokens


def test_diff_of_means_recovers_a_planted_direction():
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  u = jax.random.normal(k1, (32,))
  u = u / jnp.linalg.norm(u)
  a = jax.random.normal(k2, (400, 32)) + 1.5 * u
  b = jax.random.normal(k3, (400, 32))
  v = rep.diff_of_means(a, b)
  assert float(jnp.linalg.norm(v)) == pytest.approx(1.0, abs=1e-6)
  assert float(rep.cosine(v, u)) > 0.9
  raw = rep.diff_of_means(a, b, unit=False)
  np.testing.assert_allclose(raw, np.asarray(a).mean(0) - np.asarray(b).mean(0), atol=1e-5)


def test_steering_moves_only_its_layer_by_alpha_v_and_is_linear(model):
  cfg, graphdef, params, tokens = model
  m = nnx.merge(graphdef, params)
  L, D = cfg.num_layers, cfg.hidden_size
  v = jax.random.normal(jax.random.key(5), (D,))
  base = m(tokens, return_hidden_states=True)
  layer = 1
  hidden = {}
  for alpha in (1.0, 2.0):
    out = m(tokens, return_hidden_states=True, steer=rep.steering(L, layer, v, alpha))
    hidden[alpha] = out.hidden_states
    for i in range(layer):  # the embeddings and earlier blocks: untouched
      np.testing.assert_array_equal(out.hidden_states[i], base.hidden_states[i])
    np.testing.assert_allclose(
      out.hidden_states[layer] - base.hidden_states[layer],
      np.broadcast_to(alpha * np.asarray(v), base.hidden_states[layer].shape),
      atol=1e-5,
    )
    assert np.abs(np.asarray(out.logits - base.logits)).max() > 1e-4
  # linear in alpha at its layer: the move at 2 is twice the move at 1
  np.testing.assert_allclose(
    hidden[2.0][layer] - base.hidden_states[layer],
    2 * (hidden[1.0][layer] - base.hidden_states[layer]),
    atol=1e-5,
  )
  # alpha = 0 is no steering at all
  zero = m(tokens, return_hidden_states=True, steer=rep.steering(L, layer, v, 0.0))
  np.testing.assert_array_equal(zero.logits, base.logits)
  with pytest.raises(ValueError, match="not a block"):
    rep.steering(L, 0, v, 1.0)
  with pytest.raises(ValueError, match="steer has shape"):
    m(tokens, steer=jnp.zeros((L + 1, D)))


def test_logit_lens_is_the_norm_and_head_product(model):
  cfg, graphdef, params, tokens = model
  m = nnx.merge(graphdef, params)
  out = m(tokens, return_hidden_states=True)
  lens = rep.logit_lens(graphdef, params, out.hidden_states)  # [L+1, B, T, V]
  np.testing.assert_allclose(lens[-1], out.logits, atol=1e-5)
  h = np.asarray(out.hidden_states[1], np.float64)
  normed = h / np.sqrt((h**2).mean(-1, keepdims=True) + cfg.rms_norm_eps)
  normed = normed * np.asarray(m.final_norm[...], np.float64)
  head = np.asarray(m.embed[...], np.float64).T if m.lm_head is None else np.asarray(m.lm_head[...])
  np.testing.assert_allclose(lens[1], normed @ head, atol=1e-4)


def test_capture_equals_the_models_hidden_states_at_the_positions(model):
  cfg, graphdef, params, tokens = model
  start = jnp.asarray([0, 2, 1], jnp.int32)
  full = nnx.merge(graphdef, params)(tokens, start=start, return_hidden_states=True).hidden_states
  positions = np.asarray([[6, 3], [6, 2], [5, 1]], np.int32)
  got = rep.make_capture(graphdef)(params, tokens, start, (0, cfg.num_layers), positions)
  assert got.shape == (2, 3, 2, cfg.hidden_size)
  for j, layer in enumerate((0, cfg.num_layers)):
    for b in range(3):
      np.testing.assert_allclose(got[j, b], full[layer, b, positions[b]], atol=1e-5)
  np.testing.assert_array_equal(rep.last_positions(np.asarray(start), 7), [[6], [6], [6]])


def test_linear_cka_invariances_and_numpy_formula():
  k1, k2, k3 = jax.random.split(jax.random.key(2), 3)
  x = jax.random.normal(k1, (64, 10))
  q, _ = jnp.linalg.qr(jax.random.normal(k2, (10, 10)))
  assert float(rep.linear_cka(x, 3.0 * x @ q)) == pytest.approx(1.0, abs=1e-5)
  y = jax.random.normal(k3, (64, 6))
  xc, yc = (np.asarray(a, np.float64) - np.asarray(a, np.float64).mean(0) for a in (x, y))
  want = np.linalg.norm(yc.T @ xc) ** 2 / (np.linalg.norm(xc.T @ xc) * np.linalg.norm(yc.T @ yc))
  assert float(rep.linear_cka(x, y)) == pytest.approx(want, rel=1e-4)
  assert float(rep.linear_cka(x, y)) < 0.5  # independent representations
  assert np.isnan(float(rep.linear_cka(jnp.ones((8, 3)), y[:8])))  # a constant one: undefined


def test_auroc_and_tpr_at_fpr_against_pairwise_references():
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 2, 200)
  scores = rng.normal(size=200) + labels + np.round(rng.normal(size=200), 1) * 0  # ties below
  scores[:20] = 0.5  # ties count one half
  pos, neg = scores[labels == 1], scores[labels == 0]
  pairs = (pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()
  assert detection.auroc(scores, labels) == pytest.approx(pairs, abs=1e-12)
  for fpr in (0.0, 0.05, 0.2, 1.0):
    best = 0.0
    for t in np.concatenate([[np.inf], np.unique(scores)]):
      if (neg >= t).mean() <= fpr:
        best = max(best, (pos >= t).mean())
    assert detection.tpr_at_fpr(scores, labels, fpr) == pytest.approx(best)
  with pytest.raises(ValueError, match="one class"):
    detection.auroc(scores, np.ones(200))
  with pytest.raises(ValueError, match="NaN"):
    detection.auroc(np.full(200, np.nan), labels)
  with pytest.raises(ValueError, match="200 scores for 3 labels"):
    detection.auroc(scores, labels[:3])
