"""End-to-end: the CLI on the smoke config, kill -9 resume, and one-line errors."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

SMOKE = "experiments/quickstart.py:smoke"


def _cmd(workdir, *overrides, config=SMOKE):
  return [
    sys.executable,
    "-m",
    "posttrain_jax.main",
    f"--config={config}",
    f"--workdir={workdir}",
    "--config.progress=False",
    *overrides,
  ]


def _env(repo_root):
  env = dict(os.environ)
  env["JAX_COMPILATION_CACHE_DIR"] = os.environ["POSTTRAIN_JAX_COMPILATION_CACHE"]
  env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "1"
  return env


def _run(repo_root, args, timeout=600):
  return subprocess.run(
    args, cwd=repo_root, env=_env(repo_root), capture_output=True, text=True, timeout=timeout
  )


def _records(path):
  with open(path) as f:
    out = [json.loads(line) for line in f]
  return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in out]


RESUME_OVERRIDES = ("--config.rl.steps=8", "--config.rl.checkpoint_every=2")


@pytest.fixture(scope="module")
def uninterrupted(repo_root, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("full")
  proc = _run(repo_root, _cmd(workdir, *RESUME_OVERRIDES))
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir, proc


def test_smoke_run_writes_summary_table_and_curves(uninterrupted):
  workdir, proc = uninterrupted
  summary = json.loads((workdir / "summary.json").read_text())
  for key in ("accuracy_before_rl", "accuracy_after_rl", "pass_at_k_after_rl"):
    assert 0.0 <= summary[key] <= 1.0
  assert summary["k"] == 2
  assert "| before_rl |" in proc.stdout and "| after_rl |" in proc.stdout
  assert (workdir / "curves.png").stat().st_size > 1000
  rl = _records(workdir / "rl" / "metrics.jsonl")
  assert [r["step"] for r in rl] == list(range(0, 9))
  for key in (
    "reward/mean",
    "loss/pg",
    "ratio/mean",
    "gen/len_mean",
    "policy/entropy",
    "batch/zero_signal_groups",
    "rollouts/generated",
  ):
    assert key in rl[-1]
  # config.eval.rl_summary: mean / sum / last of those RL metrics in summary.json
  steps = [r for r in rl if "rollouts/generated" in r]
  assert summary["rl_sum/rollouts/generated"] == sum(r["rollouts/generated"] for r in steps)
  assert summary["rl_last/batch/zero_signal_groups"] == steps[-1]["batch/zero_signal_groups"]
  zero = [r["batch/zero_signal_groups"] for r in steps]
  assert summary["rl_first/batch/zero_signal_groups"] == zero[0]
  if np.median(zero) > 0:  # the scale-free peak: max / median
    assert summary["rl_spike/batch/zero_signal_groups"] == max(zero) / np.median(zero)
  assert (
    abs(
      summary["rl_mean/batch/zero_signal_groups"]
      - sum(r["batch/zero_signal_groups"] for r in steps) / len(steps)
    )
    < 1e-12
  )
  assert (
    any(p.startswith("events") for p in os.listdir(workdir / "rl" / "tb" / "metrics"))
    if (workdir / "rl" / "tb").exists()
    else True
  )


def test_rerun_of_finished_workdir_skips_stages(repo_root, uninterrupted):
  workdir, first = uninterrupted
  before = (workdir / "summary.json").read_text()
  proc = _run(repo_root, _cmd(workdir, *RESUME_OVERRIDES))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "already finished" in proc.stderr
  assert json.loads((workdir / "summary.json").read_text()) == json.loads(before)


def test_kill_9_during_rl_then_resume_matches_uninterrupted(repo_root, uninterrupted, tmp_path):
  full, _ = uninterrupted
  workdir = tmp_path / "killed"
  proc = subprocess.Popen(
    _cmd(workdir, *RESUME_OVERRIDES),
    cwd=repo_root,
    env=_env(repo_root),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  metrics = workdir / "rl" / "metrics.jsonl"
  deadline = time.time() + 300
  while time.time() < deadline:
    if metrics.exists() and any(r["step"] >= 5 for r in _records(metrics)):
      break
    assert proc.poll() is None, "run finished before it could be killed"
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert not (workdir / "rl" / "done.json").exists()
  resumed = _run(repo_root, _cmd(workdir, *RESUME_OVERRIDES))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert _records(metrics) == _records(full / "rl" / "metrics.jsonl")
  assert json.loads((workdir / "summary.json").read_text()) == json.loads(
    (full / "summary.json").read_text()
  )


def _one_error_line(proc, *needles):
  assert proc.returncode != 0
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.splitlines() if "error" in l.lower()]
  assert lines, proc.stderr[-2000:]
  for needle in needles:
    assert needle in proc.stderr, proc.stderr[-2000:]


def test_unknown_config_key(repo_root, tmp_path):
  _one_error_line(_run(repo_root, _cmd(tmp_path / "w", "--config.rl.nope=1")), "nope")


def test_unknown_env(repo_root, tmp_path):
  _one_error_line(
    _run(repo_root, _cmd(tmp_path / "w", "--config.env.name=chess")),
    "error: config.env.name='chess' is unknown",
    "countdown, digit_sum",
  )


def test_unknown_loss(repo_root, tmp_path):
  _one_error_line(
    _run(repo_root, _cmd(tmp_path / "w", "--config.rl.policy_loss=magic")),
    "config.rl.policy_loss='magic'",
    "ppo_clip",
  )


def test_unwritable_workdir(repo_root, tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  _one_error_line(_run(repo_root, _cmd(blocker / "sub")), "not writable", "--workdir")


def test_corrupt_checkpoint(repo_root, tmp_path):
  workdir = tmp_path / "w"
  proc = _run(repo_root, _cmd(workdir, '--config.stages=("pretrain",)'))
  assert proc.returncode == 0, proc.stderr[-2000:]
  os.remove(workdir / "pretrain" / "done.json")
  step_dir = workdir / "pretrain" / "checkpoints" / "6"
  for root, _, files in os.walk(step_dir / "state"):
    for name in files:
      with open(os.path.join(root, name), "wb") as f:
        f.write(b"garbage")
  proc = _run(repo_root, _cmd(workdir, '--config.stages=("pretrain",)'))
  _one_error_line(
    proc, f"checkpoint {step_dir} is corrupt: ", "rerun the same command with --fallback_checkpoint"
  )
  assert proc.returncode == 2
  # The exact command that falls back ends the one line; it completes the stage.
  command = proc.stderr.strip().splitlines()[-1].rsplit(": ", 1)[1]
  assert command.endswith(
    f"--workdir={workdir} --config.progress=False "
    "'--config.stages=(\"pretrain\",)' --fallback_checkpoint"
  ), command
  retry = _run(repo_root, _cmd(workdir, '--config.stages=("pretrain",)', "--fallback_checkpoint"))
  assert retry.returncode == 0, retry.stderr[-2000:]
  assert (step_dir.parent / "6.corrupt").is_dir() and (workdir / "pretrain" / "done.json").exists()
