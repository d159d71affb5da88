"""The shared-prompt forward (models.grouped_forward, updates.completion_forward(group=...), the
sampler's grouped prefill, train.rl.shared_prefix_group): the same logits, gradients, updates
and rollouts as the per-row forward, and a broken layout caught."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posttrain_jax import models, rollout
from posttrain_jax.train import inputs, updates
from posttrain_jax.train import rl as rl_lib
from posttrain_jax.train import rl_step as step_lib
from posttrain_jax.train import state as state_lib

V, EOS, PAD = 19, 1, 0
P, G = 3, 4


def _model(**overrides):
  cfg = dataclasses.replace(models.preset("nano", vocab_size=V), **overrides)
  return nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0)))


def _rows(T: int, seed: int = 0):
  """P left-padded prompts of lengths 2, 4, 5 (S: their padded length), each repeated G times, and random
  completions of T tokens: (prompts [P, S], start [P], tokens [P*G, S+T], start [P*G])."""
  rng = np.random.default_rng(seed)
  lists = [list(rng.integers(2, V, n)) for n in (2, 4, 5)]
  prompts, mask = rollout.left_pad(lists, PAD)
  start = (prompts.shape[1] - mask.sum(1)).astype(np.int32)
  comp = rng.integers(2, V, (P * G, T)).astype(np.int32)
  tokens = np.concatenate([np.repeat(prompts, G, 0), comp], 1)
  return prompts, start, tokens, np.repeat(start, G)


@pytest.mark.parametrize(
  "overrides",
  [{}, {"causal_block": 3}, {"qkv_bias": True}, {"qk_norm": True, "tie_embeddings": False}],
)
def test_grouped_forward_equals_full_forward(overrides):
  graphdef, params = _model(**overrides)
  model = nnx.merge(graphdef, params)
  prompts, start, tokens, row_start = _rows(T=7)
  S = prompts.shape[1]
  full = model(jnp.asarray(tokens), start=jnp.asarray(row_start)).logits[:, S - 1 :]
  grouped = models.grouped_forward(
    model, jnp.asarray(prompts), jnp.asarray(start), jnp.asarray(tokens[:, S:]), G
  ).logits
  assert grouped.shape == (P * G, 8, V)
  np.testing.assert_allclose(grouped, full, atol=2e-5, rtol=2e-5)
  # No completion tokens: only the prompt's last position (predicting the first token).
  one = models.grouped_forward(
    model, jnp.asarray(prompts), jnp.asarray(start), jnp.zeros((P * G, 0), jnp.int32), G
  ).logits
  np.testing.assert_allclose(one[:, 0], full[:, 0], atol=2e-5, rtol=2e-5)


def test_grouped_forward_rejects_moe_and_bad_rows():
  graphdef, params = _model()
  model = nnx.merge(graphdef, params)
  prompts, start, tokens, _ = _rows(T=3)
  S = prompts.shape[1]
  with pytest.raises(ValueError, match="not 5 per each of 3 prompts"):
    models.grouped_forward(
      model, jnp.asarray(prompts), jnp.asarray(start), jnp.asarray(tokens[:, S:]), 5
    )
  moe_graph, moe_params = nnx.split(
    models.Decoder(models.preset("nano_moe", vocab_size=V), rngs=nnx.Rngs(0))
  )
  with pytest.raises(ValueError, match="dense models only"):
    models.grouped_forward(
      nnx.merge(moe_graph, moe_params),
      jnp.asarray(prompts),
      jnp.asarray(start),
      jnp.asarray(tokens[:, S:]),
      G,
    )


def test_grouped_logprob_gradient_equals_full_and_finite_differences():
  graphdef, params = _model()
  prompts, _, tokens, row_start = _rows(T=6, seed=1)
  S = prompts.shape[1]
  weights = jnp.asarray(np.random.default_rng(2).normal(size=(P * G, 6)), jnp.float32)

  def objective(p, group):
    lp, _ = updates.sequence_logprobs(
      graphdef, p, jnp.asarray(tokens), jnp.asarray(row_start), S, group=group
    )
    return jnp.sum(lp * weights)

  full_val, full_grad = jax.value_and_grad(objective)(params, 0)
  val, grad = jax.value_and_grad(objective)(params, G)
  np.testing.assert_allclose(val, full_val, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(full_grad)):
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)
  # One directional derivative by central differences (float64 would be exact; float32 with a
  # small step agrees to a few 1e-3).
  direction = jax.tree.map(lambda x: jax.random.normal(jax.random.key(3), x.shape, x.dtype), params)
  eps = 1e-3
  plus = jax.tree.map(lambda p, d: p + eps * d, params, direction)
  minus = jax.tree.map(lambda p, d: p - eps * d, params, direction)
  fd = (objective(plus, G) - objective(minus, G)) / (2 * eps)
  analytic = sum(jnp.vdot(g, d) for g, d in zip(jax.tree.leaves(grad), jax.tree.leaves(direction)))
  np.testing.assert_allclose(fd, analytic, rtol=2e-2)


def test_completion_forward_counts_rows_that_break_the_groups():
  graphdef, params = _model()
  prompts, _, tokens, row_start = _rows(T=4)
  S = prompts.shape[1]
  ok = updates.completion_forward(
    graphdef, params, jnp.asarray(tokens), jnp.asarray(row_start), S, group=G
  )
  assert int(ok.prefix_mismatch) == 0
  broken = tokens.copy()
  broken[G + 1, S - 1] = (broken[G + 1, S - 1] + 1) % V  # row 5's prompt differs from row 4's
  bad_start = row_start.copy()
  bad_start[2 * G + 3] -= 1
  out = updates.completion_forward(
    graphdef, params, jnp.asarray(broken), jnp.asarray(bad_start), S, group=G
  )
  assert int(out.prefix_mismatch) == 2
  assert (
    updates.completion_forward(
      graphdef, params, jnp.asarray(tokens), jnp.asarray(row_start), S
    ).prefix_mismatch
    is None
  )


def _assert_same_adam_updates(a_tree, b_tree, lr: float, steps: int):
  """Parameters after the same Adam updates computed two ways (float32 reassociation apart).
  Adam divides by sqrt(v): a gradient entry near zero can turn reassociation noise into a step
  of up to lr in either direction, so a few entries may differ by up to ``2 lr`` per step; a
  wrong gradient moves most of them. Hence: at most 0.1% of entries beyond 2e-5, none beyond
  ``2 lr steps``."""
  for a, b in zip(jax.tree.leaves(a_tree), jax.tree.leaves(b_tree)):
    diff = np.abs(np.asarray(a) - np.asarray(b))
    assert np.mean(diff > 2e-5) < 1e-3, np.mean(diff > 2e-5)
    assert diff.max() <= 2 * lr * steps, diff.max()


def _batch(graphdef, params, group_rows: int):
  prompts = [[5, 6, 7], [8, 9, 10, 11], [12, 13]]
  tokens, mask = rollout.left_pad([p for p in prompts for _ in range(group_rows)], PAD)
  sample = rollout.make_sampler(graphdef, rollout.SamplerConfig(6, EOS, PAD))
  ro = sample(params, tokens, mask, jax.random.key(0))
  rows = len(prompts) * group_rows
  return inputs.TrainBatch(
    **{
      "tokens": ro.tokens,
      "start": ro.start,
      "mask": ro.completion_mask,
      "old_logprobs": ro.logprobs,
      "behaviour_logprobs": ro.logprobs,
      "is_weights": jnp.ones_like(ro.logprobs),
      "advantages": jnp.asarray(np.random.default_rng(0).normal(size=rows), jnp.float32),
      "ref_logprobs": ro.logprobs - 0.1,
      "rewards": jnp.zeros(rows),
      "group": jnp.repeat(jnp.arange(len(prompts)), group_rows),
      "valid": jnp.ones(rows),
    }
  ), ro.prompt_len


def test_rl_update_with_shared_prompts_equals_per_row_update():
  graphdef, params = _model()
  batch, S = _batch(graphdef, params, G)
  controls = {"kl_coef": jnp.float32(0.1), "dcmdp_lam": jnp.float32(0.0)}
  tx = state_lib.make_optimizer(lr=1e-2, steps=10)
  out = {}
  for group in (0, G):
    cfg = updates.RLLossConfig(kl_coef=0.1, entropy_coef=0.01, epochs=2, group=group)
    update = updates.make_rl_update(graphdef, tx, S, cfg)
    state, metrics = update(state_lib.init_state(params, tx), batch, controls, jax.random.key(1))
    out[group] = (state.params, metrics)
  _assert_same_adam_updates(out[0][0], out[G][0], lr=1e-2, steps=2)
  np.testing.assert_allclose(out[G][1]["loss/total"], out[0][1]["loss/total"], rtol=1e-4)
  assert float(out[G][1]["train/prefix_mismatch"]) == 0.0
  assert "train/prefix_mismatch" not in out[0][1]
  with pytest.raises(ValueError, match="minibatches of whole groups"):
    updates.make_rl_update(graphdef, tx, S, updates.RLLossConfig(minibatches=2, group=G))(
      state_lib.init_state(params, tx), batch, controls, jax.random.key(1)
    )


def test_minibatches_of_whole_groups_equal_per_row_updates_on_those_groups():
  graphdef, params = _model()
  batch, S = _batch(graphdef, params, G)
  batch = jax.tree.map(lambda x: jnp.concatenate([x, x]), batch)  # 6 groups of G rows
  batch = batch.replace(group=jnp.repeat(jnp.arange(6), G))
  controls = {"kl_coef": jnp.float32(0.1), "dcmdp_lam": jnp.float32(0.0)}
  tx = state_lib.make_optimizer(lr=1e-2, steps=10)
  key = jax.random.key(1)
  cfg = updates.RLLossConfig(kl_coef=0.1, minibatches=3, group=G)
  shared, _ = updates.make_rl_update(graphdef, tx, S, cfg)(
    state_lib.init_state(params, tx), batch, controls, key
  )
  # The same minibatches by hand: the epoch's permutation of the 6 groups, 2 groups each,
  # every one a per-row update of its rows.
  order = np.asarray(jax.random.permutation(jax.random.fold_in(key, 0), 6))
  one = updates.make_rl_update(graphdef, tx, S, updates.RLLossConfig(kl_coef=0.1))
  state = state_lib.init_state(params, tx)
  for j in range(3):
    rows = np.concatenate([np.arange(g * G, (g + 1) * G) for g in order[2 * j : 2 * j + 2]])
    state, _ = one(state, jax.tree.map(lambda x: x[rows], batch), controls, key)
  _assert_same_adam_updates(shared.params, state.params, lr=1e-2, steps=3)
  # A different grouping (the rows' own permutation) is a different update.
  rows_perm, _ = updates.make_rl_update(
    graphdef, tx, S, updates.RLLossConfig(kl_coef=0.1, minibatches=3)
  )(state_lib.init_state(params, tx), batch, controls, key)
  assert (
    max(
      float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
      for a, b in zip(jax.tree.leaves(rows_perm.params), jax.tree.leaves(state.params))
    )
    > 1e-3
  )


def test_grouped_prefill_samples_the_same_rollouts():
  graphdef, params = _model()
  tokens, mask = rollout.left_pad(
    [p for p in ([5, 6, 7], [8, 9, 10, 11], [12]) for _ in range(G)], PAD
  )
  base = rollout.SamplerConfig(9, EOS, PAD, decode_chunk=4)
  a = rollout.make_sampler(graphdef, base)(params, tokens, mask, jax.random.key(4))
  b = rollout.make_sampler(graphdef, dataclasses.replace(base, prefill_group=G))(
    params, tokens, mask, jax.random.key(4)
  )
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
  np.testing.assert_array_equal(a.completion_mask, b.completion_mask)
  with pytest.raises(ValueError, match="does not divide"):
    rollout.make_sampler(graphdef, dataclasses.replace(base, prefill_group=5))(
      params, tokens, mask, jax.random.key(4)
    )


def _rl_cfg(**overrides):
  from posttrain_jax import defaults

  cfg = defaults.base_config().rl
  cfg.update(overrides)
  return cfg


def test_shared_prefix_group_only_where_the_layout_allows():
  dense = models.preset("nano", vocab_size=V)
  sparse = models.preset("nano_moe", vocab_size=V)
  kw = dict(scheduler_name="none", replay_rows=0, routing_replay=False)
  assert rl_lib.shared_prefix_group(_rl_cfg(group_size=8), dense, **kw) == 8
  assert rl_lib.shared_prefix_group(_rl_cfg(shared_prefix=False), dense, **kw) == 0
  assert rl_lib.shared_prefix_group(_rl_cfg(group_size=1), dense, **kw) == 0
  assert rl_lib.shared_prefix_group(_rl_cfg(minibatches=2), dense, **kw) == 8
  assert rl_lib.shared_prefix_group(_rl_cfg(minibatches=3), dense, **kw) == 0  # 16 prompts
  assert rl_lib.shared_prefix_group(_rl_cfg(), sparse, **kw) == 0
  assert rl_lib.shared_prefix_group(_rl_cfg(), dense, **{**kw, "scheduler_name": "cero"}) == 0
  assert rl_lib.shared_prefix_group(_rl_cfg(), dense, **{**kw, "scheduler_name": "uniform"}) == 8
  assert rl_lib.shared_prefix_group(_rl_cfg(), dense, **{**kw, "replay_rows": 4}) == 0


def test_rl_iteration_shares_prompts_and_raises_on_a_broken_layout(tmp_path, monkeypatch):
  from posttrain_jax.bench import speed as bench
  from posttrain_jax.train import context as context_lib
  from posttrain_jax.train import generation
  from tests.train import rl_fixtures

  losses = {}
  for shared in (True, False):
    config = rl_fixtures.smoke_config(steps=1)
    config.rl.shared_prefix = shared
    ctx, run_state, rl_run, _ = bench.rl_setup(config, str(tmp_path / str(shared)))
    assert rl_run.layout.group == (config.rl.group_size if shared else 0)
    _, record = step_lib.rl_step(ctx, rl_run, run_state, None, jax.random.key(0), 0)
    losses[shared] = record["loss/total"]
    assert record.get("train/prefix_mismatch", 0.0) == 0.0
    assert ("train/prefix_mismatch" in record) == shared
  np.testing.assert_allclose(losses[True], losses[False], rtol=1e-4, atol=1e-6)

  # A layout that breaks the groups (rows swapped across two prompts) is caught, not trained on
  # silently.
  generate = generation.generate

  def swapped(*args, **kwargs):
    gen = generate(*args, **kwargs)
    perm = np.arange(gen.ro.tokens.shape[0])
    perm[[0, -1]] = perm[[-1, 0]]
    return gen._replace(ro=jax.tree.map(lambda x: x[perm], gen.ro))

  config = rl_fixtures.smoke_config(steps=1)
  ctx, run_state, rl_run, _ = bench.rl_setup(config, str(tmp_path / "broken"))
  monkeypatch.setattr(generation, "generate", swapped)
  with pytest.raises(context_lib.TrainingError, match="shared_prefix=False"):
    step_lib.rl_step(ctx, rl_run, run_state, None, jax.random.key(0), 0)
