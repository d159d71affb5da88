"""Experiment helpers: applying an arm's overrides and declaring a sweep."""

import pytest

from posttrain_jax import defaults


def test_apply_arm_sets_updates_and_replaces_free_form_sections():
  c = defaults.base_config()
  c.rl.scheduler.kwargs.update(stale=1)
  defaults.apply_arm(
    c.rl,
    {
      "policy_loss": "hpo",
      "policy_loss_kwargs": {"beta": 0.5},
      "dcmdp": {"enabled": True, "lr": 0.0},
      "scheduler": {"name": "cero", "kwargs": {"g_min": 2}},
      "reward_shaping": {"overlong": {"buffer": 2}},
    },
  )
  assert c.rl.policy_loss == "hpo" and dict(c.rl.policy_loss_kwargs) == {"beta": 0.5}
  assert c.rl.dcmdp.enabled and c.rl.dcmdp.lr == 0.0 and c.rl.dcmdp.delta == 0.01  # kept
  assert c.rl.scheduler.name == "cero" and dict(c.rl.scheduler.kwargs) == {"g_min": 2}
  assert dict(c.rl.reward_shaping.overlong) == {"buffer": 2}
  with pytest.raises(ValueError, match="no section"):
    defaults.apply_arm(c.rl, {"nope": {"x": 1}})


def test_sweep_checks_the_claim_before_any_run():
  claim = dict(text="a beats b", arm="a", metric="m", direction="higher")
  s = defaults.sweep(title="t", arms=("a", "b"), baseline="b", claim=claim, metrics=("m",))
  assert s.claim.arm == "a" and s.shared_stages == ("pretrain",)
  with pytest.raises(ValueError, match="claim lacks"):
    defaults.sweep(title="t", arms=("a", "b"), baseline="b", claim={"text": "x"}, metrics=())
  with pytest.raises(ValueError, match="must be arms"):
    defaults.sweep(title="t", arms=("a", "b"), baseline="c", claim=claim, metrics=())
  with pytest.raises(ValueError, match="direction"):
    defaults.sweep(
      title="t", arms=("a", "b"), baseline="b", claim={**claim, "direction": "up"}, metrics=()
    )
