"""Shared by the tests of parallel/: subprocess environment, the 8-device check runner, and the
PartitionSpecs the nano model's parameters get."""

import json
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def env() -> dict:
  """Environment of test subprocesses: the repository's persistent compilation cache, the CPU
  platform, no inherited device-count flags."""
  out = dict(os.environ)
  out.pop("XLA_FLAGS", None)
  out["JAX_PLATFORMS"] = "cpu"
  out["JAX_COMPILATION_CACHE_DIR"] = os.environ["POSTTRAIN_JAX_COMPILATION_CACHE"]
  out["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"
  return out


# Trainer rules (FSDP over 'fsdp', TP over 'tensor') on the nano model with V=32, D=64, H=4,
# K=2, hd=16, F=256, L=2: every dimension divides, so each logical name keeps its axis.
TRAINER_SPECS = {
  "embed": "('tensor', 'fsdp')",  # [V, D]
  "final_norm": "(None,)",
  "layers/attn_norm": "(None, None)",
  "layers/mlp_norm": "(None, None)",
  "layers/q": "(None, 'fsdp', 'tensor', None)",  # [L, D, H, hd]
  "layers/k": "(None, 'fsdp', 'tensor', None)",  # [L, D, K, hd]
  "layers/v": "(None, 'fsdp', 'tensor', None)",
  "layers/o": "(None, 'tensor', None, 'fsdp')",  # [L, H, hd, D]
  "layers/gate": "(None, 'fsdp', 'tensor')",  # [L, D, F]
  "layers/up": "(None, 'fsdp', 'tensor')",
  "layers/down": "(None, 'tensor', 'fsdp')",  # [L, F, D]
}
# Sampler rules: tensor-parallel only.
SAMPLER_SPECS = {k: v.replace("'fsdp'", "None") for k, v in TRAINER_SPECS.items()}


def run_check(mode: str, workdir) -> dict:
  script = os.path.join(os.path.dirname(__file__), "mesh_check.py")
  proc = subprocess.run(
    [sys.executable, script, mode, str(workdir)],
    capture_output=True,
    text=True,
    timeout=600,
    env=env(),
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["device_count"] == 8
  return out
