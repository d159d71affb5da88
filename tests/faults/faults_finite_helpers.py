"""Helpers of tests/faults/test_faults_finite.py: the smoke config, in-process and subprocess
runs, records without timings (copied from tests/test_main.py, not imported: test modules do
not import each other)."""

import json
import os
import subprocess
import sys

import faults_common  # tests/faults/faults_common.py

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SMOKE = "experiments/quickstart.py:smoke"


smoke_config = faults_common.smoke_config


def records(path) -> list[dict]:
  """The JSONL records at ``path`` without their ``time/`` keys."""
  with open(path, encoding="utf-8") as f:
    out = [json.loads(line) for line in f]
  return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in out]


def summary(workdir) -> dict:
  with open(os.path.join(workdir, "summary.json"), encoding="utf-8") as f:
    return json.load(f)


def cmd(workdir, *overrides, config=SMOKE) -> list[str]:
  return [
    sys.executable,
    "-m",
    "posttrain_jax.main",
    f"--config={config}",
    f"--workdir={workdir}",
    "--config.progress=False",
    *overrides,
  ]


def env() -> dict:
  out = dict(os.environ)
  out["JAX_COMPILATION_CACHE_DIR"] = os.environ["POSTTRAIN_JAX_COMPILATION_CACHE"]
  out["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "1"
  return out


def run(repo_root, args, timeout=600) -> subprocess.CompletedProcess:
  return subprocess.run(
    args, cwd=repo_root, env=env(), capture_output=True, text=True, timeout=timeout
  )
