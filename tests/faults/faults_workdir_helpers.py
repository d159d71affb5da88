"""Shared by the workdir fault tests: the smoke config in process, the entry point as a
subprocess (as tests/test_main.py starts it), records without wall times, a file tree's bytes."""

import json
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SMOKE = "experiments/quickstart.py:smoke"


def smoke_config(**rl):
  """experiments/quickstart.py:smoke without progress bars, with ``rl`` overrides."""
  from posttrain_jax.sweeps import runner  # pylint: disable=import-outside-toplevel

  c = runner.load_config_module(os.path.join(REPO, "experiments", "quickstart.py")).get_config(
    "smoke"
  )
  c.progress = False
  c.rl.update(rl)
  return c


def cmd(workdir, *args, config=SMOKE):
  return [
    sys.executable,
    "-m",
    "posttrain_jax.main",
    f"--config={config}",
    f"--workdir={workdir}",
    "--config.progress=False",
    *args,
  ]


def env():
  out = dict(os.environ)
  out["JAX_COMPILATION_CACHE_DIR"] = os.environ["POSTTRAIN_JAX_COMPILATION_CACHE"]
  out["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "1"
  return out


def run_main(workdir, *args, timeout=600):
  return subprocess.run(
    cmd(workdir, *args), cwd=REPO, env=env(), capture_output=True, text=True, timeout=timeout
  )


def records(path):
  """A metrics.jsonl's records without their wall-time keys."""
  with open(path, encoding="utf-8") as f:
    out = [json.loads(line) for line in f]
  return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in out]


def tree(root) -> dict:
  """{relative path: bytes} of every file under ``root`` (symlinks as their target)."""
  out = {}
  for dirpath, _, files in os.walk(root):
    for name in files:
      path = os.path.join(dirpath, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, root)] = f.read()
  return out


def cpu_env():
  """Environment of multi-process CPU runs (as tests/parallel/mesh_fixtures.py sets it)."""
  out = env()
  out.pop("XLA_FLAGS", None)
  out["JAX_PLATFORMS"] = "cpu"
  return out


def free_port() -> int:
  import socket  # pylint: disable=import-outside-toplevel

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]
