"""The benchmark harness on a reduced workload: no timing asserted, only that it runs and that a
steady-state RL iteration compiles nothing new."""

import json
import math
import os
import subprocess
import sys

from posttrain_jax.sweeps import bench

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_steady_state_iterations_do_not_recompile():
  r = bench.run("tiny_kl", preset="nano", iters=3, warmup=2, max_new=4, group=2, prompts=2,
                measure_peak=False)
  assert r["steady_compiles"] == 0, r
  # The first iterations compile a fixed, small set of programs (sampler, log-probs,
  # reference, advantages, IS weights, mismatch metrics, the update, ...).
  assert 0 < r["compiles_warmup"] <= 40, r["compiles_warmup"]
  assert r["kl_coef"] == 0.04 and r["max_new"] == 4
  for key in ("iteration_s", "generate_s", "train_step_s", "compile_s", "peak_rss_mb",
              "tokens_per_s"):
    assert r[key] > 0 and math.isfinite(r[key]), key


def test_bench_script_smoke():
  proc = subprocess.run([sys.executable, "scripts/bench.py", "--workload", "tiny", "--preset",
                         "nano", "--iters", "2", "--warmup", "1", "--max_new", "4", "--group",
                         "2", "--prompts", "2", "--json", "--cache_dir", ""], cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  record = json.loads(proc.stdout.strip().splitlines()[-1])
  assert record["workload"] == "tiny" and 0 < record["mfu"] < 5
  bad = subprocess.run([sys.executable, "scripts/bench.py", "--workload", "huge"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
  assert bad.returncode == 2 and "valid: tiny" in bad.stderr
