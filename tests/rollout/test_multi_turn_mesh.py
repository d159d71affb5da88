"""The multi-turn sampler (and its bucket scheduler) sharded over 8 fake CPU devices equals the
single-device one
(multi_turn_mesh_check.py, a subprocess: the device count is fixed when JAX starts)."""

import json
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "parallel"))

import mesh_fixtures  # noqa: E402


def test_sharded_multi_turn_rollouts_equal_single_device():
  script = os.path.join(os.path.dirname(__file__), "multi_turn_mesh_check.py")
  proc = subprocess.run(
    [sys.executable, script],
    capture_output=True,
    text=True,
    timeout=600,
    env=mesh_fixtures.env(),
    cwd=REPO,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["devices"] == 8 and out["row_devices"] == 8
  assert out["calls"] >= 10 and out["same_calls"]
  assert out["tokens_equal"] and out["masks_equal"]
  assert out["logprobs_diff"] < 1e-5
  assert out["bucket_batches"] >= 4 and out["bucket_same"] and out["bucket_row_devices"] == 8
  assert out["bucket_logprobs_diff"] < 1e-5
