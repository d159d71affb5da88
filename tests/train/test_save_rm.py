"""SAVE's online reward model in the RL run (train/save_rm.py): the two heads read the stage's
layout, an update moves the RM, the policy is rewarded by the current RM with the verifier
logged, the frozen variant never changes, and a resumed run equals an uninterrupted one."""

import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from posttrain_jax import defaults, rollout
from posttrain_jax import io as ptio
from posttrain_jax import methods as methods_lib
from posttrain_jax.methods import validate
from posttrain_jax.methods.save import online_rm as save_rm
from posttrain_jax.registry import ConfigError
from posttrain_jax.rewards import reward_model as rm_lib
from posttrain_jax.train import state as state_lib

STAGE = rm_lib.STAGE


def save_config(**save):
  """Nano model, arithmetic level 1: the reward_model stage (env pairs) then RL with SAVE."""
  c = defaults.make_smoke(defaults.addition_base(0))
  c.stages = (STAGE, "rl")
  c.progress = False
  c.env.level = 1
  c.reward_model.update(
    steps=20, batch_size=16, lr=1e-3, eval_every=20, checkpoint_every=20, pairs=256
  )
  c.rl.update(steps=4, eval_every=0, checkpoint_every=2, prompts_per_step=4, group_size=4)
  c.rl.save.update(dict(enabled=True, lr=1e-3, **save))
  return c


@pytest.fixture(scope="module")
def stage_dir(tmp_path_factory):
  """A workdir whose reward_model stage is done (each test copies it and runs RL there)."""
  workdir = str(tmp_path_factory.mktemp("save_stage"))
  c = save_config()
  c.stages = (STAGE,)
  methods_lib.run(c, workdir)
  return workdir


def _copy(stage_dir, tmp_path, name):
  out = str(tmp_path / name)
  shutil.copytree(stage_dir, out)
  return out


def _rl_records(workdir):
  return [r for r in ptio.read_jsonl(os.path.join(workdir, "rl", "metrics.jsonl")) if r["step"] > 0]


def test_heads_read_the_stage_layout(stage_dir):
  """The reward column on a rollout (left-padded prompt, completion) equals the stage's own
  score of prompt + completion + EOS right-padded; the value head starts as the reward head, so
  V(x) is the stage's score of the prompt's tokens alone."""
  rm = rm_lib.load("", stage_dir)
  graphdef, params = save_rm.build_params(rm, "reward_head", 0)
  tok = rm.tokenizer
  prompts, completions = ["1+30=", "7+5="], ["31", "13"]
  S = 8
  ptoks, pmask = rollout.encode_prompts(tok, prompts, length=S)
  comp = tok(completions, add_special_tokens=False)["input_ids"]
  T = 4
  ctoks = np.full((2, T), tok.pad_token_id, np.int32)
  lengths = np.zeros((2,), np.int32)
  for i, c in enumerate(comp):
    row = list(c) + [tok.eos_token_id]
    ctoks[i, : len(row)] = row
    lengths[i] = len(row)
  tokens = jnp.asarray(np.concatenate([ptoks, ctoks], axis=1))
  start = jnp.asarray((S - pmask.sum(axis=1)).astype(np.int32))
  r, v = save_rm.rollout_heads(graphdef, params, tokens, start, jnp.asarray(lengths), S)
  ref = rm.score(prompts, completions)
  np.testing.assert_allclose(np.asarray(r), ref, rtol=1e-4, atol=1e-5)
  ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
  t, n = rm_lib.pad(ids, 8, tok.pad_token_id)
  prompt_scores = rm_lib.scores(rm.graphdef, rm.params, jnp.asarray(t), jnp.asarray(n))
  np.testing.assert_allclose(np.asarray(v), np.asarray(prompt_scores), rtol=1e-4, atol=1e-5)
  # a fresh value head differs; the reward column is the same
  g2, p2 = save_rm.build_params(rm, "fresh", 0)
  r2, v2 = save_rm.rollout_heads(g2, p2, tokens, start, jnp.asarray(lengths), S)
  np.testing.assert_allclose(np.asarray(r2), np.asarray(r), rtol=1e-6)
  assert not np.allclose(np.asarray(v2), np.asarray(v))


def test_update_lowers_the_save_loss_on_a_batch(stage_dir):
  """Repeated SAVE updates on one batch lower its contrastive loss (the RM moves toward its
  filtered pairs) and the value loss; the frozen mode has no update."""
  rm = rm_lib.load("", stage_dir)
  graphdef, params = save_rm.build_params(rm, "reward_head", 0)
  c = save_config()
  tx = state_lib.make_optimizer(lr=3e-3, steps=100)
  S, G = 8, 4
  update = save_rm.make_update(graphdef, tx, S, G, c.rl.save)
  rng = np.random.default_rng(0)
  tok = rm.tokenizer
  prompts = [f"{a}+{b}=" for a, b in rng.integers(0, 50, size=(2, 2))]
  ptoks, pmask = rollout.encode_prompts(tok, [p for p in prompts for _ in range(G)], length=S)
  ctoks = rng.integers(3, len(tok), size=(2 * G, 4)).astype(np.int32)
  ctoks[:, -1] = tok.eos_token_id
  lengths = rng.integers(1, 5, size=(2 * G,)).astype(np.int32)
  batch = {
    "tokens": jnp.asarray(np.concatenate([ptoks, ctoks], 1)),
    "start": jnp.asarray((S - pmask.sum(1)).astype(np.int32)),
    "lengths": jnp.asarray(lengths),
    "valid": jnp.ones((2 * G,), jnp.float32),
  }
  state = state_lib.init_state(params, tx)
  first = None
  for _ in range(8):
    state, m = update(state, batch)
    first = first or (float(m["save/contrastive"]), float(m["save/value_loss"]))
  assert float(m["save/pairs"]) > 0
  assert float(m["save/contrastive"]) < first[0]
  assert float(m["save/value_loss"]) < first[1]
  assert int(state.step) == 8


def test_rl_run_rewards_the_policy_with_the_online_rm(stage_dir, tmp_path):
  workdir = _copy(stage_dir, tmp_path, "save")
  methods_lib.run(save_config(), workdir)
  records = _rl_records(workdir)
  assert [r["step"] for r in records] == [1, 2, 3, 4]
  for r in records:
    # the policy's reward is the RM's normalised score, not the verifier's
    assert r["reward/mean"] == pytest.approx(r["save/rm_reward"], abs=1e-5)
    assert 0.0 <= r["save/true_reward"] <= 1.0  # the verifier's 0/1, logged only
    assert 0.0 <= r["save/rm_accuracy"] <= 1.0 and np.isfinite(r["save/hacking_gap"])
    assert np.isfinite(r["save/loss"]) and r["save/skipped"] == 0
  assert records[0]["save/hacking_gap"] == pytest.approx(0.0, abs=1e-6)
  assert any(r["save/pairs"] > 0 for r in records)
  assert any(abs(r["reward/mean"] - r["save/true_reward"]) > 1e-3 for r in records)
  assert any(r["save/grad_norm"] > 0 for r in records)


def _saved_rm(workdir):
  state, _ = ptio.checkpoint.restore_single_device(os.path.join(workdir, "rl", "checkpoints"))
  return state["save_rm"], np.asarray(state["save_ref"])


def test_frozen_rm_never_changes_and_no_filter_uses_every_ordered_pair(stage_dir, tmp_path):
  """frozen: no update, the checkpointed RM is the one built from the stage (step 0, the same
  reward head). no_filter: no row dropped, at most every ordered pair of each group."""
  frozen = _copy(stage_dir, tmp_path, "frozen")
  methods_lib.run(save_config(mode="frozen"), frozen)
  records = _rl_records(frozen)
  assert "save/loss" not in records[-1] and "save/rm_accuracy" in records[-1]
  saved, ref = _saved_rm(frozen)
  assert int(saved["step"]) == 0 and ref[0] == 1.0
  rm = rm_lib.load("", stage_dir)
  _, built = save_rm.build_params(rm, "reward_head", 0)
  head = np.asarray(saved["params"]["lm_head"]["value"])
  np.testing.assert_array_equal(head, np.asarray(built["lm_head"][...]))
  free = _copy(stage_dir, tmp_path, "no_filter")
  methods_lib.run(save_config(mode="no_filter"), free)
  g = 4
  for r in _rl_records(free):
    assert r["save/kept"] == 1.0 and r["save/pairs"] <= 4 * g * (g - 1) / 2
  saved, _ = _saved_rm(free)
  assert int(saved["step"]) > 0  # updated (a step with no ordered pair changes nothing)


class _Stop(Exception):
  pass


def test_resume_equals_an_uninterrupted_run(stage_dir, tmp_path, monkeypatch):
  """Stopped after step 3 (checkpoint at 2) and run again: steps 3-4 (policy and RM metrics)
  equal the uninterrupted run's."""
  full = _copy(stage_dir, tmp_path, "full")
  methods_lib.run(save_config(), full)
  stopped = _copy(stage_dir, tmp_path, "stopped")
  write = ptio.MetricWriter.write

  def stop_at_3(self, step, record):
    if step == 3 and "save/loss" in record:
      raise _Stop()
    return write(self, step, record)

  monkeypatch.setattr(ptio.MetricWriter, "write", stop_at_3)
  with pytest.raises(_Stop):
    methods_lib.run(save_config(), stopped)
  monkeypatch.setattr(ptio.MetricWriter, "write", write)
  methods_lib.run(save_config(), stopped)
  a, b = _rl_records(full), _rl_records(stopped)
  assert [r["step"] for r in b] == [1, 2, 3, 4]
  for ra, rb in zip(a, b):
    for key in (
      "save/loss",
      "save/rm_reward",
      "save/true_reward",
      "save/hacking_gap",
      "save/rm_accuracy",
      "reward/mean",
      "loss/total",
    ):
      if key in ra:
        assert ra[key] == pytest.approx(rb[key], rel=1e-4, abs=1e-5), (ra["step"], key)


@pytest.mark.parametrize(
  "key,value,match",
  [
    ("mode", "thaw", "mode"),
    ("objective", "triplet", "objective"),
    ("value_init", "zeros", "value_init"),
    ("k", -1.0, "k must be"),
  ],
)
def test_bad_save_config_is_a_config_error(key, value, match):
  c = save_config(**{key: value})
  with pytest.raises(ConfigError, match=match):
    validate(c)


def test_save_needs_uniform_groups():
  c = save_config()
  c.rl.group_size = 1
  with pytest.raises(ConfigError, match="group_size"):
    save_rm.check(c.rl)


def test_offline_term_is_the_stage_bt_loss(stage_dir):
  """With offline_coef the update's save/offline_bt is the stage's Bradley-Terry loss of the
  offline pairs under the parameters before the update (column 0 is the stage's head)."""
  rm = rm_lib.load("", stage_dir)
  graphdef, params = save_rm.build_params(rm, "reward_head", 0)
  c = save_config(offline_coef=0.5)
  tx = state_lib.make_optimizer(lr=1e-3, steps=10)
  S, G = 8, 4
  update = save_rm.make_update(graphdef, tx, S, G, c.rl.save)
  tok = rm.tokenizer
  ptoks, pmask = rollout.encode_prompts(tok, ["1+2="] * G, length=S)
  ctoks = np.full((G, 4), tok.pad_token_id, np.int32)
  ctoks[:, 0] = tok("3", add_special_tokens=False)["input_ids"][0]
  ctoks[:, 1] = tok.eos_token_id
  chosen = rm_lib.encode(tok, ["1+2=", "4+4="], ["3", "8"], 8)
  rejected = rm_lib.encode(tok, ["1+2=", "4+4="], ["4", "9"], 8)
  c_t, c_n = rm_lib.pad(chosen, 8, tok.pad_token_id)
  r_t, r_n = rm_lib.pad(rejected, 8, tok.pad_token_id)
  batch = {
    "tokens": jnp.asarray(np.concatenate([ptoks, ctoks], 1)),
    "start": jnp.asarray((S - pmask.sum(1)).astype(np.int32)),
    "lengths": jnp.full((G,), 2, jnp.int32),
    "valid": jnp.ones((G,), jnp.float32),
    "chosen": c_t,
    "chosen_len": c_n,
    "rejected": r_t,
    "rejected_len": r_n,
  }
  sc = rm_lib.scores(rm.graphdef, rm.params, jnp.asarray(c_t), jnp.asarray(c_n))
  sr = rm_lib.scores(rm.graphdef, rm.params, jnp.asarray(r_t), jnp.asarray(r_n))
  want = float(np.mean(np.log1p(np.exp(-(np.asarray(sc) - np.asarray(sr))))))
  state, m = update(state_lib.init_state(params, tx), batch)
  assert float(m["save/offline_bt"]) == pytest.approx(want, rel=1e-4, abs=1e-6)
  # identical rows: no pair, so the loss is the offline term plus the value loss only
  assert float(m["save/pairs"]) == 0
  assert float(m["save/loss"]) == pytest.approx(
    0.5 * want + float(m["save/value_loss"]), rel=1e-4, abs=1e-6
  )


def test_anchor_objective_with_offline_pairs_runs_in_rl(stage_dir, tmp_path):
  workdir = _copy(stage_dir, tmp_path, "anchor")
  methods_lib.run(
    save_config(objective="anchor", offline_coef=0.5, offline_batch=4, value_init="fresh"), workdir
  )
  records = _rl_records(workdir)
  assert [r["step"] for r in records] == [1, 2, 3, 4]
  for r in records:
    assert np.isfinite(r["save/offline_bt"]) and r["save/offline_bt"] > 0
    assert np.isfinite(r["save/loss"]) and r["save/skipped"] == 0
