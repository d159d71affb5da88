"""A multi-domain run (experiments/interference.py, smoke: RL on tron:spatial, then tron:logic,
then tron:pattern, each an rl stage with its own env, every domain evaluated) killed with
SIGKILL inside its third RL stage resumes to the same records, the same evaluation and the
same domains table (scripts/analyze.py domains) as an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from posttrain_jax import methods as methods_lib
from posttrain_jax.sweeps import analyze, runner
from tests.faults import faults_workdir_helpers as h

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CONFIG = "experiments/interference.py:arm=seq,smoke"
# the third stage long enough to be killed inside; an entropy bonus moves the parameters even
# when a smoke model's rewards are all 0
FLAGS = (
  "--config.stage_specs.rl_pattern.overrides.rl.steps=8",
  "--config.rl.checkpoint_every=2",
  "--config.rl.entropy_coef=0.01",
)
STAGES = ("pretrain", "rl_spatial", "rl_logic", "rl_pattern")
DOMAINS = ("tron:spatial", "tron:logic", "tron:pattern")


def _config():
  c = runner.load_config_module(os.path.join(REPO, "experiments", "interference.py")).get_config(
    "arm=seq,smoke"
  )
  c.progress = False
  c.stage_specs.rl_pattern.overrides.rl.steps = 8
  c.rl.checkpoint_every = 2
  c.rl.entropy_coef = 0.01
  return c


def _records(path):
  with open(path, encoding="utf-8") as f:
    return [{k: v for k, v in json.loads(x).items() if not k.startswith("time/")} for x in f]


def _done(workdir, name):
  with open(os.path.join(workdir, name, "done.json"), encoding="utf-8") as f:
    return {k: v for k, v in json.load(f).items() if not k.startswith("time/")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("multidomain")
  summary = methods_lib.run(_config(), str(workdir))
  return workdir, summary


def test_every_domain_is_scored_and_each_rl_stage_trains_on_its_own_env(reference):
  workdir, summary = reference
  for d in DOMAINS:
    assert f"accuracy_{d}_after_rl" in summary and f"accuracy_{d}_before_rl" in summary
  for name, env in zip(STAGES[1:], DOMAINS):
    cfg = json.load(open(workdir / "config.json", encoding="utf-8"))
    assert cfg["stage_specs"][name]["overrides"]["env"]["name"] == env
  assert len(_records(workdir / "rl_pattern" / "metrics.jsonl")) > len(
    _records(workdir / "rl_spatial" / "metrics.jsonl")
  )


def test_killed_inside_the_third_rl_stage_resumes_to_the_same_table(reference, tmp_path):
  ref, _ = reference
  workdir = tmp_path / "w"
  cmd = [
    sys.executable,
    "-m",
    "posttrain_jax.main",
    f"--config={CONFIG}",
    f"--workdir={workdir}",
    "--config.progress=False",
    *FLAGS,
  ]
  proc = subprocess.Popen(
    cmd, cwd=REPO, env=h.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
  )
  deadline = time.time() + 600
  ckpt = workdir / "rl_pattern" / "checkpoints"
  while not (ckpt.exists() and any(ckpt.iterdir())) and proc.poll() is None:
    assert time.time() < deadline
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert not (workdir / "rl_pattern" / "done.json").exists()  # killed inside the third stage
  done = subprocess.run(cmd, cwd=REPO, env=h.env(), capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-3000:]
  for name in STAGES[:3]:
    assert f"[{name}] already finished" in done.stderr
  for name in STAGES[1:]:
    assert _records(workdir / name / "metrics.jsonl") == _records(ref / name / "metrics.jsonl"), (
      name
    )
  assert _done(workdir, "eval") == _done(ref, "eval")
  tables = [
    analyze.domains_table(str(w), STAGES, domains=DOMAINS, examples=8)["rows"]
    for w in (ref, workdir)
  ]
  assert tables[0] == tables[1]
