"""Every advantage, policy loss and RL option selectable by name runs in the RL loop."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rl_fixtures as fx

from posttrain_jax import methods as methods_lib
from posttrain_jax import objectives
from posttrain_jax.train import updates


def _smoke_config(**rl):
  c = fx.smoke_config(2)
  for key, value in rl.items():
    if isinstance(value, dict):
      c.rl[key].update(value)
    else:
      c.rl[key] = value
  return c


def _run(tmp_path, **rl):
  methods_lib.run(_smoke_config(**rl), str(tmp_path))
  with open(tmp_path / "rl" / "metrics.jsonl") as f:
    records = [json.loads(line) for line in f]
  assert [r["step"] for r in records] == [1, 2]
  for r in records:
    for k, v in r.items():
      assert not (isinstance(v, float) and math.isnan(v)), (k, r)
  return records[-1]


@pytest.fixture
def loop(monkeypatch):
  """What the RL loop computed at each step: the advantage function's inputs and outputs, and
  the update's parameters (before the step), batch and metrics."""
  seen = {"advantages": [], "updates": []}
  make_adv, make_update = updates.make_advantage_fn, updates.make_rl_update

  def advantage_fn(name, kwargs, num_groups):
    fn = make_adv(name, kwargs, num_groups)

    def call(inputs):
      out = fn(inputs)
      seen["advantages"].append((name, dict(kwargs), num_groups, inputs, out[0]))
      return out

    return call

  def update_fn(graphdef, tx, prompt_len, cfg, **kw):
    update = make_update(graphdef, tx, prompt_len, cfg, **kw)

    def call(state, batch, controls, key, *frozen):
      params = jax.tree.map(jnp.copy, state.params)  # the update donates its state
      new_state, metrics = update(state, batch, controls, key, *frozen)
      seen["updates"].append((graphdef, prompt_len, cfg, params, batch, controls, metrics))
      return new_state, metrics

    return call

  monkeypatch.setattr(updates, "make_advantage_fn", advantage_fn)
  monkeypatch.setattr(updates, "make_rl_update", update_fn)
  return seen


ADVANTAGE_KWARGS = {  # required ones, and verl's conventions (objectives/conventions.py)
  "pass_at_k": {"k": 2},
  "max_at_k": {"k": 2},
  "maxpo": {"k": 2},
  "reinforce_pp_baseline": {"whitening": "unbiased", "weigh": "tokens"},
  "gae": {"whitening": "unbiased"},
  "gpg": {"alpha": "nonzero_rewards"},
}


@pytest.mark.parametrize("name", sorted(objectives.ADVANTAGES))
def test_every_advantage_runs_in_the_loop(tmp_path, loop, name):
  """The loop calls the named estimator and trains on its output: the update's advantages are
  the registry function's value on the inputs the loop gave it."""
  last = _run(tmp_path, advantage=name, advantage_kwargs=ADVANTAGE_KWARGS.get(name, {}))
  assert "mismatch/k3" in last and "ratio/mean" in last
  assert len(loop["advantages"]) == len(loop["updates"]) == 2
  for (adv_name, kwargs, num_groups, inputs, out), update in zip(
    loop["advantages"], loop["updates"]
  ):
    assert adv_name == name
    want, _ = objectives.ADVANTAGES[name](inputs, num_groups=num_groups, **kwargs)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(update[4].advantages), np.asarray(out))
  if name == "gae":
    assert last["critic/loss"] > 0
  if name == "numca":  # the answers are numbers: completions reach number states
    for *_, inputs, _ in loop["advantages"]:
      keys, mask = np.asarray(inputs.milestones), np.asarray(inputs.mask)
      assert keys.dtype == np.int32 and keys.shape == mask.shape
      assert (keys[mask > 0] != -1).any()
    assert 0.0 <= last["adv/numca_value_mean"] <= 1.0
  if name == "hista":  # the policy's last layer before each completion token
    for *_, inputs, _ in loop["advantages"]:
      assert inputs.hidden.shape[:2] == inputs.mask.shape
      assert float(jnp.abs(inputs.hidden).max()) > 0
  if name == "remax":  # one greedy rollout per prompt (methods/remax/): its reward, per row
    for *_, inputs, _ in loop["advantages"]:
      base, group = np.asarray(inputs.baseline_rewards), np.asarray(inputs.group)
      assert set(np.unique(base)) <= {0.0, 1.0}
      for g in np.unique(group):
        assert len(set(base[group == g])) == 1


def _policy_loss_value(update) -> float:
  """The registry policy loss on the update's batch at its starting parameters."""
  graphdef, prompt_len, cfg, params, batch, controls, _ = update
  logprobs, _ = updates.sequence_logprobs(
    graphdef,
    params,
    batch.tokens,
    batch.start,
    prompt_len,
    temperature=cfg.temperature,
    group=cfg.group,
  )
  fn = objectives.POLICY_LOSSES[cfg.policy_loss]
  kwargs = dict(cfg.policy_loss_kwargs)
  if cfg.beta_from_controls:
    kwargs["beta"] = controls["hpo_beta"]
  kwargs.update({f: getattr(batch, f) for f in getattr(fn, "reads", ())})
  loss, _ = fn(
    logprobs,
    batch.old_logprobs,
    batch.advantages,
    batch.mask,
    aggregation=cfg.aggregation,
    norm_length=cfg.norm_length,
    weights=batch.is_weights,
    **kwargs,
  )
  return float(loss)


@pytest.mark.parametrize("name", sorted(objectives.POLICY_LOSSES))
def test_every_policy_loss_runs_in_the_loop(tmp_path, loop, name):
  """The update's ``loss/pg`` at each step equals the named registry loss on that step's batch
  and parameters (one minibatch: measured before the step)."""
  kwargs = {"ppo_clip": {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0}}.get(name, {})
  last = _run(tmp_path, policy_loss=name, policy_loss_kwargs=kwargs)
  assert "policy/entropy" in last
  for update in loop["updates"]:
    assert update[2].policy_loss == name
    assert float(update[6]["loss/pg"]) == pytest.approx(
      _policy_loss_value(update), rel=1e-4, abs=1e-6
    )


def test_mismatch_options_staleness_precision_tis_dcmdp(tmp_path):
  last = _run(
    tmp_path,
    staleness=2,
    sampler_precision="int8",
    is_correction="tis",
    is_correction_kwargs={"level": "sequence", "cap": 2.0},
    old_logprobs="recomputed",
    dcmdp={"enabled": True, "delta": 0.0, "lr": 1.0, "lam0": 0.5},
  )
  assert last["mismatch/k3"] > 0  # int8 sampler weights differ from the trainer's
  assert last["control/dcmdp_lam"] > 0.5  # D > δ = 0 pushes λ up
  assert "dcmdp/d_hat" in last


def test_kl_options(tmp_path):
  last = _run(tmp_path, kl_coef=0.05, kl_estimator="full_reverse")
  assert last["kl/ref"] >= -1e-6  # exact KL; float32 rounding near 0
  last = _run(
    tmp_path / "b",
    kl_coef=0.05,
    kl_in_reward=True,
    kl_controller="adaptive",
    kl_target=1.0,
    kl_horizon=1000.0,
  )
  assert 0 < last["control/kl_coef"] < 0.05  # KL far below the target lowers β
  # the estimator's keywords reach it: k3+ bounded to [0, 0] gives exactly 0, unbounded > 0
  # (the entropy bonus moves the policy off the reference: the smoke rewards are all equal)
  free = _run(tmp_path / "c", kl_coef=0.05, kl_estimator="k3+", lr=0.01, entropy_coef=0.5)
  bounded = _run(
    tmp_path / "d",
    kl_coef=0.05,
    kl_estimator="k3+",
    kl_estimator_kwargs={"clamp": 0.0},
    lr=0.01,
    entropy_coef=0.5,
  )
  assert free["kl/ref"] > 0 and bounded["kl/ref"] == 0.0
  # rl.kl_aggregation="policy" averages the KL with the policy loss's aggregation (verl, TRL)
  moved = dict(kl_coef=0.05, lr=0.01, entropy_coef=0.5, aggregation="seq_mean_token_mean")
  tokens = _run(tmp_path / "g", **moved)
  policy = _run(tmp_path / "h", kl_aggregation="policy", **moved)
  assert tokens["kl/ref"] > 0 and policy["kl/ref"] > 0
  assert abs(tokens["kl/ref"] - policy["kl/ref"]) > 1e-6 * tokens["kl/ref"]
  # rl.kl_bias_correction weights the KL by π/π_old: it changes the value once the policy has
  # moved off the sampler's (a second epoch)
  two = dict(moved, epochs=2)
  plain = _run(tmp_path / "i", **two)
  corrected = _run(tmp_path / "j", kl_bias_correction=True, **two)
  assert abs(plain["kl/ref"] - corrected["kl/ref"]) > 1e-6 * plain["kl/ref"]
  from posttrain_jax.train import ConfigError

  with pytest.raises(ConfigError, match=r"kl_estimator_kwargs has unknown.*clamp"):
    methods_lib.run(
      _smoke_config(kl_coef=0.05, kl_estimator="k1", kl_estimator_kwargs={"clamp": 1.0}),
      str(tmp_path / "e"),
    )
  with pytest.raises(ConfigError, match="takes no keywords"):
    methods_lib.run(
      _smoke_config(kl_coef=0.05, kl_estimator="full_reverse", kl_estimator_kwargs={"clamp": 1.0}),
      str(tmp_path / "f"),
    )


def test_mis_and_echorl(tmp_path, loop):
  """EchoRL's term in the loop equals echo_clip_loss on the update's batch; without step
  delimiters the config is refused (the whole response would be one clip)."""
  from posttrain_jax.train import ConfigError

  with pytest.raises(ConfigError, match="step_delimiters is empty"):
    methods_lib.run(_smoke_config(aux_loss="echorl"), str(tmp_path / "refused"))
  last = _run(
    tmp_path,
    is_correction="mis",
    is_correction_kwargs={"level": "token"},
    aux_loss="echorl",
    aux_loss_kwargs={"coef": 0.1, "success_value": 0.0},
    step_delimiters="+=",
  )
  graphdef, prompt_len, cfg, params, batch, _, metrics = loop["updates"][-1]
  fwd = updates.completion_forward(
    graphdef,
    params,
    batch.tokens,
    batch.start,
    prompt_len,
    temperature=cfg.temperature,
    group=cfg.group,
  )
  step_end = objectives.step_ends_from_tokens(
    batch.tokens[:, prompt_len:], batch.mask, delimiter_ids=cfg.step_delimiters
  )
  want, _ = objectives.echo_clip_loss(
    fwd.logprobs,
    objectives.entropy_from_logits(fwd.logits),
    batch.rewards,
    batch.group,
    batch.valid,
    batch.mask,
    step_end,
    num_groups=cfg.num_groups,
    coef=0.1,
    success_value=0.0,
  )
  assert len(cfg.step_delimiters) == 2
  assert last["echo/den"] > 0  # success_value 0: every all-equal group is clipped
  assert float(metrics["loss/echo"]) == pytest.approx(float(want), rel=1e-4, abs=1e-7)


def test_unknown_names_list_valid_ones(tmp_path):
  from posttrain_jax.train import ConfigError

  with pytest.raises(ConfigError, match="maxpo"):
    methods_lib.run(_smoke_config(advantage="nope"), str(tmp_path))
  with pytest.raises(ConfigError, match="accepts"):
    methods_lib.run(_smoke_config(policy_loss_kwargs={"bogus": 1}), str(tmp_path))
  # a keyword's value is checked against the values it accepts, before any step runs
  with pytest.raises(ConfigError, match=r"whitening='verl' is unknown; valid: population, unb"):
    methods_lib.run(
      _smoke_config(advantage="reinforce_pp", advantage_kwargs={"whitening": "verl"}),
      str(tmp_path),
    )
  with pytest.raises(ConfigError, match=r"alpha='verl' is unknown; valid: paper, nonzero_rewards"):
    methods_lib.run(
      _smoke_config(advantage="gpg", advantage_kwargs={"alpha": "verl"}), str(tmp_path)
    )


def _records(tmp_path, **rl):
  _run(tmp_path, **rl)
  with open(tmp_path / "rl" / "metrics.jsonl") as f:
    return [json.loads(line) for line in f]


def test_a_hpo_controller_equals_per_batch_a_hpo_loss(tmp_path):
  # With one minibatch and no momentum, the controller's whole-batch β is the a_hpo loss's β.
  per_batch = _records(tmp_path / "loss", policy_loss="a_hpo")
  controlled = _records(tmp_path / "ctl", policy_loss="hpo", hpo={"controller": "a_hpo"})
  for a, b in zip(per_batch, controlled):
    assert b["control/hpo_beta"] == pytest.approx(b["hpo/beta"], rel=1e-6)
    for key in ("hpo/beta", "loss/pg", "reward/mean", "train/grad_norm"):
      assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key
  smoothed = _records(
    tmp_path / "m", policy_loss="hpo", hpo={"controller": "a_hpo", "momentum": 0.5}
  )
  # β_1 = 0.5 · β_0 + 0.5 · target, with β_0 = 1.
  target = controlled[0]["hpo/beta"]
  assert smoothed[0]["hpo/beta"] == pytest.approx(0.5 + 0.5 * target, rel=1e-5)


def test_hpo_group_length_norm(tmp_path):
  from posttrain_jax.train import ConfigError

  last = _run(tmp_path, policy_loss="hpo", hpo={"group_length_norm": True})
  assert "hpo/neg_token_frac" in last
  with pytest.raises(ConfigError, match="minibatches=1"):
    methods_lib.run(
      _smoke_config(policy_loss="hpo", minibatches=2, hpo={"group_length_norm": True}),
      str(tmp_path / "b"),
    )
  with pytest.raises(ConfigError, match="policy_loss='hpo'"):
    methods_lib.run(_smoke_config(hpo={"controller": "a_hpo"}), str(tmp_path / "c"))
