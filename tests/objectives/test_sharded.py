"""Objectives sharded over 8 fake CPU devices equal the single-device call."""

import json
import os
import subprocess
import sys


def test_sharded_equals_unsharded():
  script = os.path.join(os.path.dirname(__file__), "sharded_check.py")
  proc = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  diffs = json.loads(proc.stdout.strip().splitlines()[-1])
  assert len(diffs) > 20
  bad = {k: v for k, v in diffs.items() if not v <= 1e-5}
  assert not bad, bad
