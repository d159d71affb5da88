"""Random inputs and gradient-pattern checks shared by the objectives tests (numpy only)."""

import numpy as np


def loss_batch(seed=0, b=6, t=5, spread=0.5):
  """(new, old, adv, mask): log-probs [b, t] f32 with ``new - old ~ N(0, spread)``, adv [b]."""
  rng = np.random.default_rng(seed)
  old = np.log(rng.uniform(0.05, 0.9, size=(b, t))).astype(np.float32)
  new = (old + rng.normal(scale=spread, size=(b, t))).astype(np.float32)
  adv = rng.normal(size=(b,)).astype(np.float32)
  mask = (rng.random((b, t)) < 0.8).astype(np.float32)
  mask[:, 0] = 1.0
  return new, old, adv, mask


def logprob_pair(seed=0, b=4, t=6, spread=0.4):
  """(trainer, sampler, mask): log-probs [b, t] f32 that differ by N(0, spread) noise."""
  rng = np.random.default_rng(seed)
  sampler = np.log(rng.uniform(0.05, 0.95, size=(b, t))).astype(np.float32)
  trainer = (sampler + rng.normal(scale=spread, size=(b, t))).astype(np.float32)
  mask = (rng.random((b, t)) < 0.75).astype(np.float32)
  mask[:, 0] = 1.0
  return trainer, sampler, mask


def assert_ppo_clip_pattern(g, new, old, adv, mask, *, low=0.8, high=1.2):
  """PPO-clip gradient pattern: zero on clipped or masked tokens, non-zero everywhere else."""
  g = np.asarray(g)
  ratio = np.exp(new - old)
  a = adv[:, None] * np.ones_like(new)
  clipped = ((a > 0) & (ratio > high)) | ((a < 0) & (ratio < low))
  assert clipped[mask > 0].any(), "the batch has no clipped token; widen its spread"
  np.testing.assert_array_equal(g[clipped], 0.0)
  np.testing.assert_array_equal(g[mask == 0], 0.0)
  assert np.all(g[(~clipped) & (mask > 0)] != 0.0), "an unclipped real token got no gradient"
