"""Every advantage, policy loss and RL option selectable by name runs in the RL loop."""

import json
import math

import pytest

from posttrain_jax import objectives
from posttrain_jax.train import experiment

import rl_fixtures as fx


def _smoke_config(**rl):
  c = fx.smoke_config(2)
  for key, value in rl.items():
    if isinstance(value, dict):
      c.rl[key].update(value)
    else:
      c.rl[key] = value
  return c


def _run(tmp_path, **rl):
  experiment.run(_smoke_config(**rl), str(tmp_path))
  with open(tmp_path / "rl" / "metrics.jsonl") as f:
    records = [json.loads(line) for line in f]
  assert [r["step"] for r in records] == [1, 2]
  for r in records:
    for k, v in r.items():
      assert not (isinstance(v, float) and math.isnan(v)), (k, r)
  return records[-1]


ADVANTAGE_KWARGS = {"pass_at_k": {"k": 2}, "max_at_k": {"k": 2}, "maxpo": {"k": 2}}


@pytest.mark.parametrize("name", sorted(objectives.ADVANTAGES))
def test_every_advantage_runs(tmp_path, name):
  last = _run(tmp_path, advantage=name, advantage_kwargs=ADVANTAGE_KWARGS.get(name, {}))
  assert "adv/mean" in last or any(k.startswith("adv/") for k in last)
  assert "mismatch/k3" in last and "ratio/mean" in last
  if name == "gae":
    assert "critic/loss" in last and last["critic/loss"] > 0


@pytest.mark.parametrize("name", sorted(objectives.POLICY_LOSSES))
def test_every_policy_loss_runs(tmp_path, name):
  kwargs = {"ppo_clip": {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0}}.get(name, {})
  last = _run(tmp_path, policy_loss=name, policy_loss_kwargs=kwargs)
  assert "loss/pg" in last and "policy/entropy" in last


def test_mismatch_options_staleness_precision_tis_dcmdp(tmp_path):
  last = _run(tmp_path, staleness=2, sampler_precision="int8", is_correction="tis",
              is_correction_kwargs={"level": "sequence", "cap": 2.0}, old_logprobs="recomputed",
              dcmdp={"enabled": True, "delta": 0.0, "lr": 1.0, "lam0": 0.5})
  assert last["mismatch/k3"] > 0  # int8 sampler weights differ from the trainer's
  assert last["control/dcmdp_lam"] > 0.5  # D > δ = 0 pushes λ up
  assert "dcmdp/d_hat" in last


def test_kl_options(tmp_path):
  last = _run(tmp_path, kl_coef=0.05, kl_estimator="full_reverse")
  assert last["kl/ref"] >= -1e-6  # exact KL; float32 rounding near 0
  last = _run(tmp_path / "b", kl_coef=0.05, kl_in_reward=True, kl_controller="adaptive",
              kl_target=1.0, kl_horizon=1000.0)
  assert 0 < last["control/kl_coef"] < 0.05  # KL far below the target lowers β


def test_mis_and_echorl(tmp_path):
  last = _run(tmp_path, is_correction="mis", is_correction_kwargs={"level": "token"},
              aux_loss="echorl", aux_loss_kwargs={"coef": 0.1})
  assert any(k.startswith("echo") for k in last)


def test_unknown_names_list_valid_ones(tmp_path):
  from posttrain_jax.train import ConfigError
  with pytest.raises(ConfigError, match="maxpo"):
    experiment.run(_smoke_config(advantage="nope"), str(tmp_path))
  with pytest.raises(ConfigError, match="accepts"):
    experiment.run(_smoke_config(policy_loss_kwargs={"bogus": 1}), str(tmp_path))


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
  smoothed = _records(tmp_path / "m", policy_loss="hpo",
                      hpo={"controller": "a_hpo", "momentum": 0.5})
  # β_1 = 0.5 · β_0 + 0.5 · target, with β_0 = 1.
  target = controlled[0]["hpo/beta"]
  assert smoothed[0]["hpo/beta"] == pytest.approx(0.5 + 0.5 * target, rel=1e-5)


def test_hpo_group_length_norm(tmp_path):
  from posttrain_jax.train import ConfigError
  last = _run(tmp_path, policy_loss="hpo", hpo={"group_length_norm": True})
  assert "hpo/neg_token_frac" in last
  with pytest.raises(ConfigError, match="minibatches=1"):
    experiment.run(_smoke_config(policy_loss="hpo", minibatches=2,
                                 hpo={"group_length_norm": True}), str(tmp_path / "b"))
  with pytest.raises(ConfigError, match="policy_loss='hpo'"):
    experiment.run(_smoke_config(hpo={"controller": "a_hpo"}), str(tmp_path / "c"))
