"""An HF checkpoint loaded onto 8 fake CPU devices: same parameters and logits, expected
shardings from the role's logical-axis rules."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

import hf_fixtures  # noqa: E402


def test_load_onto_a_mesh(tmp_path):
  c = hf_fixtures.build("qwen3", str(tmp_path / "hf"), dtype="bfloat16", max_shard_size="20KB")
  np.save(tmp_path / "tokens.npy", c.tokens)
  np.save(tmp_path / "logits.npy", c.logits)
  script = os.path.join(os.path.dirname(__file__), "hf_sharded_check.py")
  proc = subprocess.run(
    [sys.executable, script, c.path, str(tmp_path / "tokens.npy"), str(tmp_path / "logits.npy")],
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["devices"] == 8
  for role in ("trainer", "sampler"):
    r = out[role]
    assert r["param_diff"] == 0.0
    assert r["logits_vs_single"] < 1e-5 and r["logits_vs_hf"] < 1e-4, r
    for name, s in r["specs"].items():
      assert s["actual"] == s["expected"], (role, name, s)
      assert s["devices"] == 8
  trainer, sampler = out["trainer"]["specs"], out["sampler"]["specs"]
  # Trainer: FSDP over embed, tensor-parallel over heads / mlp / vocab.
  assert trainer["layers/q"]["actual"] == "(None, 'fsdp', 'tensor', None)"
  assert trainer["layers/q"]["shard"] == [2, 16, 2, 16]
  assert trainer["layers/down"]["actual"] == "(None, 'tensor', 'fsdp')"
  assert trainer["embed"]["actual"] == "('tensor', 'fsdp')"
  assert trainer["lm_head"]["shard"] == [16, 50]
  # Sampler: tensor-parallel only.
  assert sampler["layers/q"]["actual"] == "(None, None, 'tensor', None)"
  assert sampler["embed"]["actual"] == "('tensor', None)"
  # Axes that do not divide a dimension, or are taken already, are dropped (replicated).
  assert out["fallback"] == ["(None, 'tensor')", "('fsdp', None)", "('tensor', None)"]
