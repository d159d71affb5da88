import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posttrain_jax import models, rollout
from posttrain_jax.train import inputs, updates
from posttrain_jax.train import state as state_lib

V, EOS, PAD = 19, 1, 0
CONTROLS = {"kl_coef": jnp.float32(0.1), "dcmdp_lam": jnp.float32(0.0)}


@pytest.fixture(scope="module")
def setup():
  cfg = models.preset("nano", vocab_size=V)
  graphdef, params = nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0)))
  tokens, mask = rollout.left_pad([[5, 6, 7], [8, 9, 10, 11]] * 4, PAD)
  sample = rollout.make_sampler(graphdef, rollout.SamplerConfig(6, EOS, PAD))
  ro = sample(params, tokens, mask, jax.random.key(0))
  batch = inputs.TrainBatch(
    **{
      "tokens": ro.tokens,
      "start": ro.start,
      "mask": ro.completion_mask,
      "old_logprobs": ro.logprobs,
      "behaviour_logprobs": ro.logprobs,
      "is_weights": jnp.ones_like(ro.logprobs),
      "advantages": jnp.asarray(np.random.default_rng(0).normal(size=8), jnp.float32),
      "ref_logprobs": ro.logprobs - 0.1,
      "rewards": jnp.zeros(8),
      "group": jnp.repeat(jnp.arange(4), 2),
      "valid": jnp.ones(8),
    }
  )
  return graphdef, params, batch, ro.prompt_len


def test_sft_step_lowers_loss_and_donates():
  cfg = models.preset("nano", vocab_size=V)
  graphdef, params = nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0)))
  tx = state_lib.make_optimizer(lr=3e-3, steps=30)
  state = state_lib.init_state(params, tx)
  step = updates.make_sft_step(graphdef, tx)
  tokens = np.tile(np.array([[5, 6, 7, 8, 9, 1, 0, 0]], np.int32), (4, 1))
  mask = np.array([[0, 0, 0, 1, 1, 1, 0, 0]] * 4, np.float32)
  losses = []
  for _ in range(30):
    state, m = step(state, {"tokens": tokens, "loss_mask": mask})
    losses.append(float(m["loss/nll"]))
  assert losses[-1] < 0.2 * losses[0]
  assert int(state.step) == 30
  # init_state copied the params, so the caller's arrays survive donation.
  assert np.isfinite(np.asarray(jax.tree.leaves(params)[0])).all()


def test_rl_loss_jit_equals_no_jit_and_ratio_one(setup):
  graphdef, params, batch, S = setup
  cfg = updates.RLLossConfig(kl_coef=0.1, entropy_coef=0.01)
  fn = lambda p, b: updates.rl_loss(p, b, CONTROLS, graphdef=graphdef, prompt_len=S, cfg=cfg)
  a, ma = fn(params, batch)
  b, mb = jax.jit(fn)(params, batch)
  np.testing.assert_allclose(a, b, rtol=1e-5)
  # Behaviour log-probs come from the same parameters: the ratio is exactly 1.
  np.testing.assert_allclose(ma["ratio/mean"], 1.0, atol=1e-5)
  np.testing.assert_allclose(ma["ratio/clip_frac"], 0.0)
  assert ma["kl/ref"] > 0


def test_masked_tokens_get_zero_gradient(setup):
  """Gradient w.r.t. the completion logits is zero at masked positions."""
  graphdef, params, batch, S = setup
  cfg = updates.RLLossConfig()
  mask = np.asarray(batch.mask).copy()
  mask[:, 3:] = 0.0
  batch = batch.replace(mask=jnp.asarray(mask))
  from posttrain_jax import objectives

  logprobs, _ = updates.sequence_logprobs(graphdef, params, batch.tokens, batch.start, S)
  g = jax.grad(
    lambda lp: objectives.ppo_clip(lp, batch.old_logprobs, batch.advantages, batch.mask)[0]
  )(logprobs)
  np.testing.assert_array_equal(np.asarray(g)[mask == 0], 0.0)
  # And the parameter gradient does not depend on tokens under the mask.
  tokens = np.asarray(batch.tokens).copy()
  tokens[:, S + 4 :] = 7
  grad = lambda b: jax.grad(
    lambda p: updates.rl_loss(p, b, CONTROLS, graphdef=graphdef, prompt_len=S, cfg=cfg)[0]
  )(params)
  g1, g2 = grad(batch), grad(batch.replace(tokens=jnp.asarray(tokens)))
  for x, y in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(x, y, atol=1e-6)


def test_rl_update_epochs_minibatches(setup):
  graphdef, params, batch, S = setup
  tx = state_lib.make_optimizer(lr=1e-3, steps=10)
  cfg = updates.RLLossConfig(epochs=2, minibatches=2)
  update = updates.make_rl_update(graphdef, tx, S, cfg)
  state, m = update(state_lib.init_state(params, tx), batch, CONTROLS, jax.random.key(0))
  assert int(state.step) == 4
  assert float(m["train/skipped"]) == 0.0
  assert float(m["ratio/mean"]) != 1.0  # later minibatches see moved parameters


def test_nonfinite_update_is_skipped(setup):
  graphdef, params, batch, S = setup
  tx = state_lib.make_optimizer(lr=1e-3, steps=10)
  update = updates.make_rl_update(graphdef, tx, S, updates.RLLossConfig())
  state0 = state_lib.init_state(params, tx)
  before = jax.tree.map(np.asarray, state0.params)
  bad = batch.replace(advantages=batch.advantages.at[0].set(jnp.nan))
  state, m = update(state0, bad, CONTROLS, jax.random.key(0))
  assert float(m["train/skipped"]) == 1.0 and int(state.step) == 0
  for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(x, y)


def test_advantage_fn_and_unknown_name():
  fn = updates.make_advantage_fn("grpo", (), 2)
  from posttrain_jax import objectives

  adv, _ = fn(
    objectives.AdvantageInputs(
      jnp.array([1.0, 0.0, 1.0, 1.0]), jnp.array([0, 0, 1, 1]), jnp.ones(4)
    )
  )
  np.testing.assert_allclose(adv[2:], 0.0)
  with pytest.raises(ValueError, match="valid advantage names"):
    updates.make_advantage_fn("nope", (), 2)


def test_optimizer_weight_decay_mask():
  cfg = models.preset("nano", vocab_size=V, qkv_bias=True)
  _, params = nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0)))
  mask = state_lib._decay_mask(params)
  flat = {
    "/".join(str(getattr(k, "key", k)) for k in path): v
    for path, v in jax.tree_util.tree_leaves_with_path(mask)
  }
  assert not any(v for k, v in flat.items() if "norm" in k or "bias" in k)
  assert all(v for k, v in flat.items() if k.split("/")[-1] in ("q", "gate", "down", "embed"))


def test_mismatch_metrics_from_the_update_equal_a_separate_trainer_forward(setup):
  """With ``mismatch_in_loss`` the separate trainer forward is skipped; the update's first
  minibatch sees the same parameters, so its mismatch metrics are the same numbers."""
  from posttrain_jax import objectives

  graphdef, params, batch, S = setup
  # a sampler that disagrees with the trainer a little
  behaviour = batch.behaviour_logprobs + 0.05 * batch.mask * jnp.sin(
    jnp.arange(batch.mask.size, dtype=jnp.float32).reshape(batch.mask.shape)
  )
  batch = batch.replace(behaviour_logprobs=behaviour)
  trainer = updates.make_logprob_fn(graphdef, S, 1.0)(params, batch.tokens, batch.start)
  want = objectives.mismatch_metrics(trainer, behaviour, batch.mask)
  tx = state_lib.make_optimizer(lr=1e-2, steps=10)
  for epochs, minibatches in ((1, 1), (2, 1)):
    update = updates.make_rl_update(
      graphdef,
      tx,
      S,
      updates.RLLossConfig(mismatch_in_loss=True, epochs=epochs, minibatches=minibatches),
    )
    _, m = update(state_lib.init_state(params, tx), batch, CONTROLS, jax.random.key(0))
    for k, v in want.items():  # not averaged over the later (moved-parameter) updates
      np.testing.assert_allclose(m[k], v, rtol=1e-4, atol=1e-6, err_msg=k)
  assert float(want["mismatch/k3"]) > 0


def test_loss_is_the_policy_loss_plus_each_active_term_of_the_table(setup, monkeypatch):
  """rl_loss = policy loss + kl_coef * KL - entropy_coef * H, read from the terms' own metrics;
  a term added to LOSS_TERMS is applied after the others, an inactive one is not."""
  from posttrain_jax import objectives
  from posttrain_jax.train import loss_terms

  graphdef, params, batch, S = setup
  cfg = updates.RLLossConfig(kl_coef=0.1, entropy_coef=0.01)
  loss, m = updates.rl_loss(params, batch, CONTROLS, graphdef=graphdef, prompt_len=S, cfg=cfg)
  logprobs, _ = updates.sequence_logprobs(graphdef, params, batch.tokens, batch.start, S)
  pg, _ = objectives.POLICY_LOSSES["ppo_clip"](
    logprobs,
    batch.old_logprobs,
    batch.advantages,
    batch.mask,
    aggregation="token_mean",
    norm_length=None,
    weights=batch.is_weights,
  )
  want = pg + 0.1 * m["kl/ref"] - 0.01 * m["policy/entropy"]
  np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)
  table = dict(loss_terms.LOSS_TERMS)
  table["plus_one"] = loss_terms.LossTerm(lambda c: True, lambda l, x, c, k: (l + 1.0, {"t": 1}))
  table["never"] = loss_terms.LossTerm(lambda c: False, lambda l, x, c, k: (l + 100.0, {}))
  monkeypatch.setattr(loss_terms, "LOSS_TERMS", table)
  more, m2 = updates.rl_loss(params, batch, CONTROLS, graphdef=graphdef, prompt_len=S, cfg=cfg)
  np.testing.assert_allclose(more, loss + 1.0, rtol=1e-6)
  assert m2["t"] == 1 and m2["loss/total"] == more
