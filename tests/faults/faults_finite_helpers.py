"""Helpers of tests/faults/test_faults_finite.py: the smoke config, in-process and subprocess
runs, records without timings (copied from tests/test_main.py, not imported: test modules do
not import each other)."""

import importlib.util
import json
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SMOKE = "experiments/quickstart.py:smoke"


def smoke_config(**sections):
  """The quickstart's smoke config with ``sections`` applied: {"rl": {"lr": ...}, "stages": ...}."""
  spec = importlib.util.spec_from_file_location("qs", os.path.join(REPO, "experiments",
                                                                   "quickstart.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config("smoke")
  c.progress = False
  for name, value in sections.items():
    if isinstance(value, dict):
      c[name].update(value)
    else:
      c[name] = value
  return c


def records(path) -> list[dict]:
  """The JSONL records at ``path`` without their ``time/`` keys."""
  with open(path, encoding="utf-8") as f:
    out = [json.loads(line) for line in f]
  return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in out]


def summary(workdir) -> dict:
  with open(os.path.join(workdir, "summary.json"), encoding="utf-8") as f:
    return json.load(f)


def cmd(workdir, *overrides, config=SMOKE) -> list[str]:
  return [sys.executable, "-m", "posttrain_jax.main", f"--config={config}",
          f"--workdir={workdir}", "--config.progress=False", *overrides]


def env() -> dict:
  out = dict(os.environ)
  out["JAX_COMPILATION_CACHE_DIR"] = os.environ["POSTTRAIN_JAX_COMPILATION_CACHE"]
  out["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "1"
  return out


def run(repo_root, args, timeout=600) -> subprocess.CompletedProcess:
  return subprocess.run(args, cwd=repo_root, env=env(), capture_output=True, text=True,
                        timeout=timeout)
