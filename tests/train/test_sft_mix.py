"""RL+SFT parallel averaging (methods/sft_mix/, the ``sft_mix`` loss term): the update's gradient
is exactly ``beta grad L_RL + (1 - beta) grad L_CE``, the supervised rows come from a fixed pool
drawn with each step's key, and from a config a pure-CE run (beta 0) lowers the pool's loss
while beta 1 is refused."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posttrain_jax import methods as methods_lib
from posttrain_jax import models, rollout
from posttrain_jax.methods import sft_mix, validate
from posttrain_jax.registry import ConfigError
from posttrain_jax.sweeps import runner
from posttrain_jax.train import inputs, loss_terms, updates

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
V, EOS, PAD = 19, 1, 0
CONTROLS = {"kl_coef": jnp.float32(0.0), "dcmdp_lam": jnp.float32(0.0)}


def _setup():
  cfg = models.preset("nano", vocab_size=V)
  graphdef, params = nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0)))
  tokens, mask = rollout.left_pad([[5, 6, 7], [8, 9, 10, 11]] * 4, PAD)
  ro = rollout.make_sampler(graphdef, rollout.SamplerConfig(6, EOS, PAD))(
    params, tokens, mask, jax.random.key(0)
  )
  rng = np.random.default_rng(1)
  sft_tokens = jnp.asarray(rng.integers(2, V, (8, 9)), jnp.int32)
  sft_mask = jnp.asarray((np.arange(9) >= 4)[None].repeat(8, 0), jnp.float32)
  batch = inputs.TrainBatch(
    tokens=ro.tokens,
    start=ro.start,
    mask=ro.completion_mask,
    old_logprobs=ro.logprobs,
    behaviour_logprobs=ro.logprobs,
    is_weights=jnp.ones_like(ro.logprobs),
    advantages=jnp.asarray(rng.normal(size=8), jnp.float32),
    rewards=jnp.zeros(8),
    group=jnp.repeat(jnp.arange(4), 2),
    valid=jnp.ones(8),
    sft_tokens=sft_tokens,
    sft_mask=sft_mask,
  )
  return graphdef, params, batch, ro.prompt_len


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.9])
def test_the_gradient_is_beta_rl_plus_one_minus_beta_ce(beta):
  graphdef, params, batch, S = _setup()
  mixed = updates.RLLossConfig(sft_beta=beta)
  assert loss_terms.reads(mixed) == {"sft_tokens", "sft_mask"}
  assert loss_terms.reads(updates.RLLossConfig()) == frozenset()
  g_mix = jax.grad(
    lambda p: updates.rl_loss(p, batch, CONTROLS, graphdef=graphdef, prompt_len=S, cfg=mixed)[0]
  )(params)
  rl_only = batch.replace(sft_tokens=None, sft_mask=None)
  g_rl = jax.grad(
    lambda p: updates.rl_loss(
      p, rl_only, CONTROLS, graphdef=graphdef, prompt_len=S, cfg=updates.RLLossConfig()
    )[0]
  )(params)
  g_ce = jax.grad(lambda p: updates.supervised_nll(graphdef, p, batch.sft_tokens, batch.sft_mask))(
    params
  )
  want = jax.tree.map(lambda a, b: beta * a + (1 - beta) * b, g_rl, g_ce)
  for got, exp in zip(jax.tree.leaves(g_mix), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(exp), rtol=2e-4, atol=1e-6)
  _, metrics = updates.rl_loss(params, batch, CONTROLS, graphdef=graphdef, prompt_len=S, cfg=mixed)
  ce = updates.supervised_nll(graphdef, params, batch.sft_tokens, batch.sft_mask)
  assert float(metrics["loss/sft_nll"]) == pytest.approx(float(ce), rel=1e-6)


def test_supervised_nll_is_the_masked_mean_of_the_next_token_losses():
  graphdef, params, batch, _ = _setup()
  logits = np.asarray(nnx.merge(graphdef, params)(batch.sft_tokens[:, :-1]).logits, np.float64)
  lsm = logits - logits.max(-1, keepdims=True)
  lsm -= np.log(np.exp(lsm).sum(-1, keepdims=True))
  toks, mask = np.asarray(batch.sft_tokens), np.asarray(batch.sft_mask)
  nll = [-lsm[b, t - 1, toks[b, t]] for b in range(8) for t in range(1, 9) if mask[b, t]]
  got = updates.supervised_nll(graphdef, params, batch.sft_tokens, batch.sft_mask)
  np.testing.assert_allclose(float(got), np.mean(nll), rtol=1e-5)


def _config(**mix):
  c = runner.load_config_module(os.path.join(REPO, "experiments", "quickstart.py")).get_config(
    "smoke"
  )
  c.progress = False
  c.stages = ("pretrain", "rl")
  c.rl.sft_mix.update(dict(enabled=True, beta=0.5, examples=64), **mix)
  return c


def test_pool_draws_are_distinct_rows_and_depend_on_the_key(tmp_path):
  c = _config()
  validate(c)
  ctx = methods_lib.make_context(c, str(tmp_path))
  pool = sft_mix.Pool(ctx)
  assert pool.tokens.shape[0] == 64 and pool.mask.sum(1).min() >= 2  # answer + EOS
  a, b = pool.draw(jax.random.key(0), 32), pool.draw(jax.random.key(1), 32)
  assert len(set(a.tolist())) == 32 and not np.array_equal(a, b)
  np.testing.assert_array_equal(a, pool.draw(jax.random.key(0), 32))


def test_a_pure_ce_run_lowers_the_pools_loss_from_config(tmp_path):
  c = _config(beta=0.0)
  c.rl.update(steps=6, lr=3e-3, eval_every=0)
  methods_lib.run(c, str(tmp_path))
  recs = [json.loads(x) for x in open(tmp_path / "rl" / "metrics.jsonl", encoding="utf-8")]
  nll = [r["loss/sft_nll"] for r in recs if "loss/sft_nll" in r]
  assert len(nll) == 6 and nll[-1] < 0.85 * nll[0] and all(np.diff(nll) < 0)


@pytest.mark.parametrize(
  "update, message",
  [
    (dict(beta=1.0), "leaves no weight on the supervised rows"),
    (dict(source="/nope.jsonl"), None),
  ],
)
def test_bad_settings_are_refused(tmp_path, update, message):
  c = _config(**update)
  if message is None:  # a missing file: the pool says which setting and what to give
    with pytest.raises(Exception, match="is no file; give a JSONL file"):
      sft_mix.Pool(methods_lib.make_context(c, str(tmp_path)))
    return
  with pytest.raises(ConfigError, match=message):
    validate(c)


def test_replayed_rows_are_refused():
  c = _config()
  c.rl.scheduler.name = "rollout_replay"
  with pytest.raises(ConfigError, match="replayed rows"):
    validate(c)
