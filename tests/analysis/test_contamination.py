"""LaRA's metrics (analysis/contamination.py; methods_B.md section 11 (d)): identical inputs give
RSM 0 and RSI 1, the cosine metrics ignore rescaling, DC lies in [1/rank, 1] and is 1 for rank-1
data, the aggregate is invariant to permuting the layers and standardises against the
reference; the output-level baselines against numpy; a planted contamination signal is found
(AUROC via analysis/detection.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posttrain_jax.analysis import contamination as lara
from posttrain_jax.analysis import detection

L, D, J = 4, 16, 3


def _item(key, scale=1.0):
  k1, k2, k3 = jax.random.split(key, 3)
  h = jax.random.normal(k1, (L, D))
  return h, h + scale * jax.random.normal(k2, (J, L, D)), h + scale * jax.random.normal(k3, (L, D))


def test_identity_scale_invariance_and_dc_bounds():
  h, para, rm = _item(jax.random.key(0))
  np.testing.assert_allclose(lara.rsm(h, h), 0.0, atol=1e-6)
  np.testing.assert_allclose(lara.rsi(h, jnp.stack([h] * J)), 1.0, atol=1e-6)
  np.testing.assert_allclose(lara.rsm(3.0 * h, 0.5 * rm), lara.rsm(h, rm), atol=1e-6)
  np.testing.assert_allclose(lara.rsi(2.0 * h, 7.0 * para), lara.rsi(h, para), atol=1e-6)
  d = np.asarray(lara.dc(h, para, rm))
  rank = min(J + 2 - 1, D)  # J + 2 centred rows span at most J + 1 directions
  assert ((d >= 1.0 / rank - 1e-6) & (d <= 1.0 + 1e-6)).all()
  # rank-1 variants: every one on the same line through h
  u = jax.random.normal(jax.random.key(1), (L, D))
  line = jnp.stack([h + c * u for c in (0.5, 1.0, 2.0)])
  np.testing.assert_allclose(lara.dc(h, line, h - u), 1.0, atol=1e-5)
  # numpy reference of the share
  stack = np.concatenate([np.asarray(h)[None], np.asarray(para), np.asarray(rm)[None]])[:, 0]
  s = np.linalg.svd(stack - stack.mean(0), compute_uv=False)
  assert float(d[0]) == pytest.approx(s[0] ** 2 / (s**2).sum(), rel=1e-4)


def test_aggregate_standardises_and_ignores_layer_order():
  rng = np.random.default_rng(0)
  reference = jnp.asarray(rng.normal(size=(50, 3, L)))
  features = jnp.asarray(rng.normal(size=(7, 3, L)))
  s = lara.lara_scores(features, reference)
  mean, std = np.asarray(reference).mean(0), np.asarray(reference).std(0)
  np.testing.assert_allclose(s, ((np.asarray(features) - mean) / std).mean(axis=(1, 2)), atol=1e-5)
  perm = np.asarray([2, 0, 3, 1])
  np.testing.assert_allclose(
    lara.lara_scores(features[..., perm], reference[..., perm]), s, atol=1e-6
  )
  np.testing.assert_allclose(lara.lara_scores(reference, reference).mean(), 0.0, atol=1e-5)


def test_output_baselines_against_numpy():
  rng = np.random.default_rng(1)
  lp = -np.abs(rng.normal(size=(3, 6)))
  ent = np.abs(rng.normal(size=(3, 6)))
  mask = np.asarray([[1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]], np.float32)
  out = lara.output_baselines(jnp.asarray(lp), jnp.asarray(ent), jnp.asarray(mask), k=0.5)
  for i in range(3):
    real = lp[i][mask[i] > 0]
    assert float(out["loglik"][i]) == pytest.approx(real.mean(), rel=1e-5)
    assert float(out["neg_entropy"][i]) == pytest.approx(-ent[i][mask[i] > 0].mean(), rel=1e-5)
    count = max(int(np.floor(0.5 * len(real))), 1)
    assert float(out["min_k"][i]) == pytest.approx(np.sort(real)[:count].mean(), rel=1e-5)


def test_planted_contamination_is_detected():
  """Seen items: paraphrases closer (rigid), information removal moves them more."""
  keys = jax.random.split(jax.random.key(3), 120)
  feats, labels = [], []
  for i, k in enumerate(keys):
    seen = i % 2
    k1, k2, k3 = jax.random.split(k, 3)
    h = jax.random.normal(k1, (L, D))
    para = h + (0.3 if seen else 1.0) * jax.random.normal(k2, (J, L, D))
    rm = h + (2.0 if seen else 1.0) * jax.random.normal(k3, (L, D))
    feats.append(lara.metrics(h, para, rm))
    labels.append(seen)
  feats = jnp.stack(feats)
  labels = np.asarray(labels)
  clean = feats[np.flatnonzero(labels == 0)[:20]]
  held = np.arange(len(labels)) >= 40
  scores = np.asarray(lara.lara_scores(feats, clean))[held]
  assert detection.auroc(scores, labels[held]) > 0.9
