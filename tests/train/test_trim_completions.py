"""Completion trimming (config.rl.trim_completions): the trainer's forwards and the update run
on the batch's completion width instead of the max_new_tokens budget, with the same losses,
gradients and updates as the full width."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posttrain_jax import objectives, rollout
from posttrain_jax.bench import speed as bench
from posttrain_jax.methods import validate
from posttrain_jax.train import generation
from posttrain_jax.train import rl as rl_lib
from posttrain_jax.train import rl_step as step_lib
from posttrain_jax.train.validate import ConfigError
from tests.train import rl_fixtures


def _mask(lengths, T):
  return (np.arange(T)[None, :] < np.asarray(lengths)[:, None]).astype(np.float32)


def test_trimmed_length_is_the_bucket_of_the_last_unmasked_position():
  assert rollout.trimmed_length(_mask([3, 5, 1], 64), 4) == 8
  assert rollout.trimmed_length(_mask([3, 8, 1], 64), 4) == 8
  assert rollout.trimmed_length(_mask([3, 9, 1], 64), 4) == 16
  assert rollout.trimmed_length(_mask([3, 9, 1], 64), 16) == 16  # at least the minimum
  assert rollout.trimmed_length(_mask([3, 40, 1], 48), 4) == 48  # capped at the width
  assert rollout.trimmed_length(_mask([0, 0], 48), 4) == 4  # nothing unmasked
  # A hole in the mask does not hide a later unmasked position.
  mask = np.zeros((2, 64), np.float32)
  mask[1, 20] = 1.0
  assert rollout.trimmed_length(mask, 4) == 32


def test_trim_completions_cuts_every_completion_field():
  B, S, T, L, k = 4, 3, 10, 2, 2
  rng = np.random.default_rng(0)
  ro = rollout.Rollout(
    tokens=jnp.asarray(rng.integers(0, 9, (B, S + T)), jnp.int32),
    prompt_mask=jnp.ones((B, S), jnp.float32),
    completion_mask=jnp.asarray(_mask([2, 3, 1, 4], T)),
    logprobs=jnp.asarray(rng.normal(size=(B, T)), jnp.float32),
    lengths=jnp.asarray([2, 3, 1, 4], jnp.int32),
    truncated=jnp.zeros((B,), bool),
    group=jnp.arange(B, dtype=jnp.int32),
    policy_version=jnp.zeros((B,), jnp.int32),
    routes=jnp.asarray(rng.integers(0, 4, (B, L, S + T, k)), jnp.int32),
  )
  cut = rollout.trim_completions(ro, 4)
  assert cut.tokens.shape == (B, S + 4) and cut.completion_mask.shape == (B, 4)
  assert cut.logprobs.shape == (B, 4) and cut.routes.shape == (B, L, S + 4, k)
  np.testing.assert_array_equal(cut.tokens, ro.tokens[:, : S + 4])
  np.testing.assert_array_equal(cut.routes, ro.routes[:, :, : S + 4])
  np.testing.assert_array_equal(cut.logprobs, ro.logprobs[:, :4])
  np.testing.assert_array_equal(cut.completion, ro.completion[:, :4])
  for name in ("prompt_mask", "lengths", "truncated", "group", "policy_version"):
    assert getattr(cut, name) is getattr(ro, name)
  assert rollout.trim_completions(ro, T) is ro and rollout.trim_completions(ro, T + 5) is ro
  with pytest.raises(ValueError, match="length must be >= 1"):
    rollout.trim_completions(ro, 0)


def test_gae_and_terminal_rewards_do_not_depend_on_the_cut_padding():
  B, T, W = 6, 20, 8
  rng = np.random.default_rng(1)
  mask = jnp.asarray(_mask(rng.integers(1, W + 1, B), T))
  rewards = jnp.asarray(rng.normal(size=B), jnp.float32)
  values = jnp.asarray(rng.normal(size=(B, T)), jnp.float32)
  full = objectives.gae_advantages(
    objectives.terminal_rewards(rewards, mask), values, mask, gamma=0.9, lam=0.8
  )
  cut = objectives.gae_advantages(
    objectives.terminal_rewards(rewards, mask[:, :W]),
    values[:, :W],
    mask[:, :W],
    gamma=0.9,
    lam=0.8,
  )
  for a, b in zip(full, cut):
    np.testing.assert_allclose(a[:, :W], b, rtol=1e-6, atol=1e-6)
    assert not np.any(np.asarray(a[:, W:]))


def _short_completions(generate):
  """``batch.generate`` whose rollouts end after 1-5 tokens (as if EOS came early): the mask,
  log-probs, lengths and truncation flags are cut; the tokens after stay (they are masked)."""

  def short(*args, **kwargs):
    gen = generate(*args, **kwargs)
    ro = gen.ro
    B, T = ro.completion_mask.shape
    lengths = np.random.default_rng(3).integers(1, 6, B)
    keep = jnp.asarray(_mask(lengths, T))
    mask = ro.completion_mask * keep
    ro = ro.replace(
      completion_mask=mask,
      logprobs=ro.logprobs * mask,
      lengths=jnp.sum(mask, axis=1).astype(jnp.int32),
      truncated=jnp.zeros_like(ro.truncated),
    )
    return gen._replace(ro=ro)

  return short


@pytest.mark.parametrize(
  "overrides",
  [
    {},
    # Dr. GRPO's constant normaliser (the budget, not the width), a reference KL in the loss
    # and old log-probs recomputed by the trainer.
    {"aggregation": "seq_mean_token_sum_norm", "kl_coef": 0.04, "old_logprobs": "recomputed"},
    # A mixture of experts replaying the sampler's recorded routes (cut with the tokens); its
    # load-balancing loss counts the real tokens only, so the cut padding does not move it.
    {"routing_replay": True, "preset": "nano_moe"},
  ],
  ids=["grpo", "drgrpo_kl_recomputed", "moe_routing_replay"],
)
def test_an_rl_iteration_on_the_trimmed_batch_equals_the_full_width(
  tmp_path, monkeypatch, coin_env, overrides
):
  config = rl_fixtures.smoke_config(steps=1)
  overrides = dict(overrides)
  if "preset" in overrides:
    config.model.preset = overrides.pop("preset")
  config.rl.update(max_new_tokens=24, trim_min_length=4, **overrides)
  monkeypatch.setattr(generation, "generate", _short_completions(generation.generate))
  ctx, run_state, rl_run, init = bench.rl_setup(config, str(tmp_path))
  assert rl_run.layout.trim_min == 4
  ref = jax.tree.map(jnp.copy, init) if rl_lib.needs_reference(config, ctx.methods) else None
  out = {}
  for trim in (4, 0):
    rl_run = dataclasses.replace(rl_run, layout=dataclasses.replace(rl_run.layout, trim_min=trim))
    state = jax.tree.map(jnp.copy, run_state)  # the update donates its state
    new_state, record = step_lib.rl_step(ctx, rl_run, state, ref, jax.random.key(0), 0)
    out[trim] = (new_state["policy"].params, record)
  (p_cut, r_cut), (p_full, r_full) = out[4], out[0]
  assert r_cut["batch/width"] == 8 and "batch/width" not in r_full
  names = ["loss/total", "train/grad_norm", "reward/mean", "gen/len_mean"]
  moe = bool(config.rl.routing_replay)
  assert ("moe/routing_overlap" in r_full) == moe and ("moe/aux_loss" in r_full) == moe
  names += ["moe/routing_overlap", "moe/aux_loss"] if moe else []
  for name in names:
    np.testing.assert_allclose(r_cut[name], r_full[name], rtol=1e-5, atol=1e-7, err_msg=name)
  assert r_cut["train/grad_norm"] > 0
  # Adam divides by sqrt(v): a near-zero gradient's float-order difference between the two
  # widths becomes an update difference of ~1e-6 on some CPUs, hence the absolute tolerance.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=5e-6), p_cut, p_full)


def test_trimming_is_off_with_a_prompt_scheduler_and_checked_in_the_config(tmp_path):
  config = rl_fixtures.smoke_config(steps=1, scheduler="uniform")
  _, _, rl_run, _ = bench.rl_setup(config, str(tmp_path / "a"))
  assert rl_run.layout.trim_min == 0
  config = rl_fixtures.smoke_config(steps=1)
  config.rl.trim_completions = False
  _, _, rl_run, _ = bench.rl_setup(config, str(tmp_path / "b"))
  assert rl_run.layout.trim_min == 0
  for field, value, message in (
    ("trim_completions", "yes", "True or False"),
    ("trim_min_length", 0, "positive integer"),
    ("trim_min_length", 2.5, "positive integer"),
  ):
    config = rl_fixtures.smoke_config(steps=1)
    with config.unlocked():
      del config.rl[field]  # a value of another type (e.g. from a JSON config)
      config.rl[field] = value
    with pytest.raises(ConfigError, match=f"trim_.*{message}"):
      validate(config)
