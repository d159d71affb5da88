"""Mixture-of-experts RL: the sampler records routing, the trainer replays it (R3).

Unit test: the routes the jitted prefill + decode loop record equal the experts a full forward
over the generated tokens selects, and replaying them reproduces the behaviour log-probs.
Smoke runs (nano_moe, 2 RL steps): with and without ``rl.routing_replay``; both log the
load-balancing loss and a routing overlap of 1 at the first step (float32 sampler copy of the
trainer's weights, no staleness), below 1 after the update. A dense model with replay is a ConfigError.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_rl_names import _smoke_config

from posttrain_jax import methods as methods_lib
from posttrain_jax import models, rollout
from posttrain_jax.methods import validate
from posttrain_jax.train import updates
from posttrain_jax.train.validate import ConfigError

EOS, PAD, V = 1, 0, 19


def test_recorded_routes_equal_full_forward_routing():
  cfg = models.preset("nano_moe", vocab_size=V)
  graphdef, params = nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0)))
  tokens, mask = rollout.left_pad([[5, 6, 7], [8, 9, 10, 11, 12, 13], [4], [2, 3]], PAD)
  tokens, mask = jnp.asarray(np.repeat(tokens, 2, 0)), jnp.asarray(np.repeat(mask, 2, 0))
  T = 6
  sample = rollout.make_sampler(
    graphdef, rollout.SamplerConfig(max_new_tokens=T, eos_id=EOS, pad_id=PAD, record_routing=True)
  )
  ro = sample(params, tokens, mask, jax.random.key(3))
  B, S = tokens.shape
  L, k = cfg.num_layers, cfg.num_experts_per_tok
  assert ro.routes.shape == (B, L, S + T, k) and ro.routes.dtype == jnp.int32

  forward = jax.jit(lambda p, t, s: nnx.merge(graphdef, p)(t, start=s, return_routing=True))
  full = np.asarray(jnp.swapaxes(forward(params, ro.tokens, ro.start).routing, 0, 1))
  routes, start, lengths = (np.asarray(x) for x in (ro.routes, ro.start, ro.lengths))
  position = np.arange(S + T)
  real = (position[None] >= start[:, None]) & (position[None] < S + lengths[:, None])
  needed = real & (position[None] < S + T - 1)  # positions the trainer's forward reads
  recorded = (routes >= 0).all(axis=-1).all(axis=1)  # [B, S+T]
  assert recorded[needed].all()
  assert (routes[:, :, -1] == -1).all()  # the last token is never fed
  assert ((routes == -1).all(axis=-1) | (routes >= 0).all(axis=-1)).all()
  both = real[:, None, :] & recorded[:, None, :]
  np.testing.assert_array_equal(
    np.sort(routes, -1)[np.broadcast_to(both, routes.shape[:3])],
    np.sort(full, -1)[np.broadcast_to(both, full.shape[:3])],
  )

  # Replaying the recorded routes reproduces the behaviour log-probs.
  replayed = updates.make_logprob_fn(graphdef, S, 1.0)(params, ro.tokens, ro.start, ro.routes)
  np.testing.assert_allclose(replayed * ro.completion_mask, ro.logprobs, atol=1e-5)

  # Not requested: no routes, the other fields as before (traced only, not compiled).
  plain = jax.eval_shape(
    lambda: rollout.make_sampler(
      graphdef, rollout.SamplerConfig(max_new_tokens=T, eos_id=EOS, pad_id=PAD)
    )(params, tokens, mask, jax.random.key(3))
  )
  assert plain.routes is None
  assert jax.tree.structure(plain) == jax.tree.structure(ro.replace(routes=None))


def _moe_run(tmp_path, **rl):
  c = _smoke_config(**rl)
  c.model.preset = "nano_moe"
  methods_lib.run(c, str(tmp_path))
  with open(tmp_path / "rl" / "metrics.jsonl") as f:
    return [json.loads(line) for line in f]


@pytest.mark.parametrize("replay", [False, True])
def test_moe_rl_smoke(tmp_path, replay):
  records = _moe_run(tmp_path, routing_replay=replay)
  assert [r["step"] for r in records] == [1, 2]
  for r in records:
    assert np.isfinite(r["moe/aux_loss"]) and r["moe/aux_loss"] > 0
    assert np.isfinite(r["loss/total"])
    # Recorded either way (replayed or only compared): the rollout's experts against the
    # trainer's own before and after the update.
    assert 0.0 <= r["moe/routing_overlap_after"] <= 1.0
  # The sampler's float32 copy of the trainer's weights, no staleness: the same experts.
  assert records[0]["moe/routing_overlap"] == 1.0
  assert records[0]["moe/routing_overlap_after"] < 1.0  # the update moved the router
  if replay:
    # Replaying the sampler's routes with the same weights: no train-inference mismatch.
    assert abs(records[0]["mismatch/k3"]) < 1e-5


def test_routing_replay_needs_moe_model():
  c = _smoke_config(routing_replay=True)
  with pytest.raises(ConfigError, match="routing_replay"):
    validate(c)
  c.model.preset = "nano_moe"
  validate(c)
