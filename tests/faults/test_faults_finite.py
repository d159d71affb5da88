"""Issue 21, items 1 and 4: only finite, checksummed checkpoints; a bad one is set aside with one
flag; a stage's record after any crash equals an uninterrupted run's (from step 0 on)."""

import os
import shutil
import signal
import subprocess
import time

import faults_finite_helpers as h
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posttrain_jax import methods as methods_lib
from posttrain_jax import models
from posttrain_jax.io import CheckpointError
from posttrain_jax.io import checkpoint as ckpt_lib
from posttrain_jax.io import metrics as metrics_lib
from posttrain_jax.train import TrainingError, experiment, updates
from posttrain_jax.train import state as state_lib

SIGNAL = {"entropy_coef": 0.01}  # a gradient on every step, rewards or not


def _params(path, step=None):
  return jax.tree.map(np.asarray, ckpt_lib.restore_params_single_device(path, step=step))


def _assert_same(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)


def _corrupt_one_file(step_dir):
  """Flips the last byte of the largest array file under ``step_dir/state``."""
  files = [os.path.join(r, n) for r, _, ns in os.walk(os.path.join(step_dir, "state")) for n in ns]
  path = max(files, key=os.path.getsize)
  with open(path, "r+b") as f:
    f.seek(-1, os.SEEK_END)
    last = f.read(1)
    f.seek(-1, os.SEEK_END)
    f.write(bytes([last[0] ^ 0xFF]))
  return os.path.relpath(path, step_dir)


# --- every update is checked ---------------------------------------------------------------------
def test_sft_step_skips_exploding_and_nonfinite_updates():
  cfg = models.preset("nano", vocab_size=19, num_layers=1)
  graphdef, params = nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0)))
  tokens = jax.random.randint(jax.random.key(1), (4, 12), 0, 19)
  batch = {"tokens": tokens, "loss_mask": jnp.ones((4, 12), jnp.float32)}
  before = jax.tree.map(np.asarray, params)
  outcomes = {}
  for lr, ratio in ((1e-3, 1.0), (1e6, 1.0), (float("inf"), 1.0), (1e6, 0.0)):  # 4 compiles
    tx = state_lib.make_optimizer(lr=lr, steps=4)
    step = updates.make_sft_step(graphdef, tx, max_update_ratio=ratio)
    state, m = step(state_lib.init_state(params, tx), batch)
    changed = any(
      not np.array_equal(x, y)
      for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(state.params))
    )
    outcomes[lr, ratio] = (
      float(m["train/skipped"]),
      float(m["train/nonfinite"]),
      int(state.step),
      changed,
    )
  assert outcomes == {
    (1e-3, 1.0): (0.0, 0.0, 1, True),  # a sane update is applied
    (1e6, 1.0): (1.0, 0.0, 0, False),  # exploding: skipped
    (float("inf"), 1.0): (1.0, 1.0, 0, False),  # non-finite: skipped
    (1e6, 0.0): (0.0, 0.0, 1, True),
  }  # no bound: applied (the old way)


def test_checkpointer_refuses_nonfinite_state_and_keeps_the_good_ones(tmp_path):
  ckpt = ckpt_lib.Checkpointer(str(tmp_path), max_to_keep=2)
  for step in (1, 2):
    ckpt.save(step, {"w": jnp.full((2,), float(step))}, {"step": step})
  with pytest.raises(
    CheckpointError,
    match=r"refusing to write checkpoint 3 to .*: the state "
    r"holds non-finite values \(NaN or inf\); the last good checkpoint \(2\) "
    "is kept",
  ):
    ckpt.save(3, {"w": jnp.array([1.0, jnp.inf])}, {"step": 3})
  ckpt.close()
  assert ckpt_lib.finalised_steps(str(tmp_path)) == [1, 2]


def test_rl_lr_inf_never_checkpoints_nonfinite_then_a_sane_lr_completes(tmp_path):
  rl = dict(SIGNAL, steps=6, checkpoint_every=1, max_nonfinite_steps=3)
  with pytest.raises(TrainingError) as err:
    methods_lib.run(h.smoke_config(stages=("rl",), rl=dict(rl, lr=float("inf"))), str(tmp_path))
  assert str(err.value).startswith(
    "rl: every update was skipped as non-finite (NaN or inf in the loss, gradients, update or "
    "new parameters) for 3 steps in a row (last at step 3); the learning rate is likely too "
    "high: lower config.rl.lr (now inf) or clip gradients harder with config.rl.grad_clip"
  )
  ckpts = str(tmp_path / "rl" / "checkpoints")
  assert ckpt_lib.finalised_steps(ckpts) == [1, 2]  # the stop comes before step 3's save
  for step in (1, 2):  # no update applied: the starting parameters, finite
    state, _ = ckpt_lib.restore_single_device(ckpts, step=step)
    assert int(state["policy"]["step"]) == 0
  _assert_same(_params(ckpts, 1), _params(ckpts, 2))
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(_params(ckpts, 2)))
  assert not (tmp_path / "rl" / "final").exists()
  assert str(err.value).endswith(
    "and pass --rerun to restart the stage in this workdir; no checkpoint holds a skipped update"
  )
  # The advice: a lower lr, --rerun, same workdir: the stage starts over and trains.
  methods_lib.run(h.smoke_config(stages=("rl",), rl=rl), str(tmp_path), rerun=True)
  recs = h.records(tmp_path / "rl" / "metrics.jsonl")
  assert [r["step"] for r in recs] == list(range(7))
  assert [r["train/skipped"] for r in recs[1:]] == [0.0] * 6
  final = _params(str(tmp_path / "rl" / "final"))
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(final))
  (old,) = (tmp_path / "replaced").iterdir()  # the stopped stage, kept: finite checkpoints
  assert ckpt_lib.finalised_steps(str(old / "rl" / "checkpoints")) == [1, 2]


def test_rl_lr_1e6_stops_as_exploding_and_writes_no_final(tmp_path):
  with pytest.raises(TrainingError) as err:
    methods_lib.run(
      h.smoke_config(stages=("rl",), rl=dict(SIGNAL, lr=1e6, max_nonfinite_steps=2)), str(tmp_path)
    )
  assert str(err.value).startswith(
    "rl: every update was skipped as exploding (larger than config.rl.max_update_ratio=1 x "
    "the parameters' norm) for 2 steps in a row (last at step 2); the learning rate is "
    "likely too high: lower config.rl.lr (now 1e+06)"
  )
  assert not (tmp_path / "rl" / "final").exists()
  assert not (tmp_path / "rl" / "done.json").exists()


def test_pretrain_lr_1e30_stops_pretraining_before_rl(tmp_path):
  with pytest.raises(TrainingError) as err:
    methods_lib.run(
      h.smoke_config(pretrain={"lr": 1e30, "warmup_steps": 0, "max_nonfinite_steps": 2}),
      str(tmp_path),
    )
  assert str(err.value).startswith("pretrain: every update was skipped as ")
  assert "for 2 steps in a row (last at step 2)" in str(err.value)
  assert "lower config.pretrain.lr (now 1e+30)" in str(err.value)
  assert not (tmp_path / "rl").exists() and not (tmp_path / "pretrain" / "final").exists()


# --- checksums, the fallback flag, messages that lead somewhere ---------------------------------
PRETRAIN_ONLY = ("pretrain",)


@pytest.fixture(scope="module")
def pretrain_ref(tmp_path_factory):
  """An uninterrupted pretraining-only smoke run (checkpoints 3 and 6, final)."""
  workdir = tmp_path_factory.mktemp("pretrain_ref")
  methods_lib.run(h.smoke_config(stages=PRETRAIN_ONLY), str(workdir))
  return workdir


class Crash(Exception):
  """Stands for kill -9 in-process: raised from a patched write or save."""


def test_corrupt_checkpoint_names_the_flag_and_the_flag_resumes_from_the_previous(
  tmp_path, pretrain_ref, monkeypatch
):
  def crash(self, stage, params, summary):
    raise Crash(stage)

  with monkeypatch.context() as m:  # killed after checkpoint 6, before the final parameters
    m.setattr(experiment.context_lib.Context, "save_final", crash)
    with pytest.raises(Crash):
      methods_lib.run(h.smoke_config(stages=PRETRAIN_ONLY), str(tmp_path))
  ckpts = tmp_path / "pretrain" / "checkpoints"
  assert ckpt_lib.finalised_steps(str(ckpts)) == [3, 6]
  changed = _corrupt_one_file(ckpts / "6")
  with pytest.raises(CheckpointError) as err:
    methods_lib.run(h.smoke_config(stages=PRETRAIN_ONLY), str(tmp_path))
  assert err.value.fallback
  assert str(err.value) == (
    f"checkpoint {ckpts / '6'} is corrupt: {changed} changed since it was saved (sha256 "
    "mismatch); rerun the same command with --fallback_checkpoint to set it aside (renamed "
    "to 6.corrupt, nothing is deleted) and continue from the previous checkpoint"
  )
  # The advice: the same run with the flag resumes from checkpoint 3; nothing is lost.
  methods_lib.run(h.smoke_config(stages=PRETRAIN_ONLY), str(tmp_path), fallback_checkpoint=True)
  assert (ckpts / "6.corrupt" / changed).exists()
  assert ckpt_lib.finalised_steps(str(ckpts)) == [3, 6]
  assert h.records(tmp_path / "pretrain" / "metrics.jsonl") == h.records(
    pretrain_ref / "pretrain" / "metrics.jsonl"
  )
  _assert_same(
    _params(str(tmp_path / "pretrain" / "final")), _params(str(pretrain_ref / "pretrain" / "final"))
  )


def test_corrupt_final_names_the_flag_and_the_flag_finishes_the_stage_again(tmp_path, pretrain_ref):
  workdir = tmp_path / "w"
  shutil.copytree(pretrain_ref, workdir)
  final = workdir / "pretrain" / "final"
  changed = _corrupt_one_file(final / "0")
  with pytest.raises(CheckpointError) as err:
    methods_lib.run(h.smoke_config(stages=PRETRAIN_ONLY), str(workdir))
  assert str(err.value) == (
    f"the final parameters of stage pretrain in {final} are bad: {changed} changed since it "
    "was saved (sha256 mismatch); rerun the same command with --fallback_checkpoint to set "
    "them aside (renamed to final.corrupt, nothing is deleted) and finish the stage again "
    "from its checkpoints"
  )
  methods_lib.run(h.smoke_config(stages=PRETRAIN_ONLY), str(workdir), fallback_checkpoint=True)
  assert (workdir / "pretrain" / "final.corrupt" / "0" / changed).exists()
  assert (workdir / "pretrain" / "done.json.corrupt").exists()
  assert h.records(workdir / "pretrain" / "metrics.jsonl") == h.records(
    pretrain_ref / "pretrain" / "metrics.jsonl"
  )
  _assert_same(_params(str(final)), _params(str(pretrain_ref / "pretrain" / "final")))


def test_other_model_config_says_fresh_workdir_and_a_fresh_workdir_runs(tmp_path, pretrain_ref):
  """A workdir without config.json (made before the workdir kept it) that another model's
  config reaches: the checkpoint's shapes are the last guard."""
  workdir = tmp_path / "w"
  shutil.copytree(pretrain_ref, workdir)
  os.remove(workdir / "config.json")
  other = h.smoke_config(stages=PRETRAIN_ONLY)
  other.model.overrides.num_layers = 1
  with pytest.raises(CheckpointError) as err:
    methods_lib.run(other, str(workdir))
  assert not err.value.fallback
  assert str(err.value).startswith(
    f"checkpoint {workdir / 'pretrain' / 'final' / '0'} holds arrays of other shapes than "
    "this run's ("
  )
  assert str(err.value).endswith(
    "): the workdir was made with another model config (config.model); rerun with that "
    "config, or pass a fresh --workdir to start this one"
  )
  assert sorted(os.listdir(workdir / "pretrain")) == sorted(
    os.listdir(pretrain_ref / "pretrain")
  )  # nothing set aside or deleted
  methods_lib.run(other, str(tmp_path / "fresh"))
  assert (tmp_path / "fresh" / "pretrain" / "done.json").exists()


# --- resume exact from step 0 -------------------------------------------------------------------
@pytest.fixture(scope="module")
def full_ref(tmp_path_factory):
  """An uninterrupted smoke run: pretraining (checkpoints 3, 6), RL (2, 4), evaluation."""
  workdir = tmp_path_factory.mktemp("full_ref")
  methods_lib.run(h.smoke_config(), str(workdir))
  return workdir


# (stage, where, step): a crash after writing that step's record, or right after saving that
# step's checkpoint, in the order a run meets them.
CRASHES = (
  ("pretrain", "write", 2),  # before pretraining's first checkpoint
  ("pretrain", "save", 3),  # right after it
  ("pretrain", "write", 5),  # between checkpoints
  ("rl", "write", 1),  # before RL's first checkpoint (step 0's eval written)
  ("rl", "save", 2),  # right after it
  ("rl", "write", 3),
)  # between checkpoints


def test_crash_anywhere_in_either_stage_then_resume_matches_uninterrupted(
  tmp_path, full_ref, monkeypatch
):
  pending = list(CRASHES)
  write, save = metrics_lib.MetricWriter.write, ckpt_lib.Checkpointer.save

  def crash_if(kind, path, step):
    if pending and pending[0] == (os.path.basename(os.path.dirname(path)), kind, step):
      pending.pop(0)
      raise Crash(f"{kind} {path} {step}")

  def crashing_write(self, step, metrics):
    record = write(self, step, metrics)
    crash_if("write", self.path, step)
    return record

  def crashing_save(self, step, state, meta=None, **kw):
    save(self, step, state, meta, **kw)
    crash_if("save", self.directory, step)

  monkeypatch.setattr(metrics_lib.MetricWriter, "write", crashing_write)
  monkeypatch.setattr(ckpt_lib.Checkpointer, "save", crashing_save)
  for crash in CRASHES:
    with pytest.raises(Crash):
      methods_lib.run(h.smoke_config(), str(tmp_path))
    assert crash not in pending
  methods_lib.run(h.smoke_config(), str(tmp_path))
  for stage in ("pretrain", "rl"):
    assert h.records(tmp_path / stage / "metrics.jsonl") == h.records(
      full_ref / stage / "metrics.jsonl"
    ), stage
    _assert_same(_params(str(tmp_path / stage / "final")), _params(str(full_ref / stage / "final")))
  assert h.summary(tmp_path) == h.summary(full_ref)


KILL_PRETRAIN = (
  '--config.stages=("pretrain",)',
  "--config.pretrain.steps=60",
  "--config.pretrain.checkpoint_every=60",
  "--config.pretrain.eval_every=30",
)


def test_kill_9_in_pretraining_before_its_first_checkpoint_then_resume_matches(repo_root, tmp_path):
  full = h.run(repo_root, h.cmd(tmp_path / "full", *KILL_PRETRAIN))
  assert full.returncode == 0, full.stderr[-3000:]
  workdir = tmp_path / "killed"
  proc = subprocess.Popen(
    h.cmd(workdir, *KILL_PRETRAIN),
    cwd=repo_root,
    env=h.env(),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  metrics = workdir / "pretrain" / "metrics.jsonl"
  deadline = time.time() + 300
  while time.time() < deadline:
    if metrics.exists() and any(r["step"] >= 2 for r in h.records(metrics)):
      break
    assert proc.poll() is None, "run finished before it could be killed"
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert ckpt_lib.finalised_steps(str(workdir / "pretrain" / "checkpoints")) == []
  assert h.records(metrics)  # the killed run left records that the rerun must not repeat
  resumed = h.run(repo_root, h.cmd(workdir, *KILL_PRETRAIN))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert h.records(metrics) == h.records(tmp_path / "full" / "pretrain" / "metrics.jsonl")
  assert [r["step"] for r in h.records(metrics)] == list(range(1, 61))
