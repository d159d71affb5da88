"""The benchmark harness on a reduced workload: no timing asserted, only that it runs and that a
steady-state RL iteration compiles nothing new."""

import json
import math
import os
import subprocess
import sys

from posttrain_jax.bench import speed as bench

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_steady_state_iterations_do_not_recompile():
  # In this process (one CPU device): the sampler shares the trainer's device. The script
  # below runs the workload's own layout (two devices) in a fresh process.
  r = bench.run(
    "tiny_kl",
    preset="nano",
    iters=3,
    warmup=2,
    max_new=4,
    group=2,
    prompts=2,
    measure_peak=False,
    sampler_devices=0,
    dtype="bfloat16",
  )
  assert r["steady_compiles"] == 0, r
  # The first iterations compile a fixed, small set of programs (sampler, log-probs,
  # reference, advantages, IS weights, mismatch metrics, the update, ...).
  assert 0 < r["compiles_warmup"] <= 40, r["compiles_warmup"]
  assert r["kl_coef"] == 0.04 and r["max_new"] == 4
  assert r["compile_all_stages_s"] >= r["compile_backend_s"] > 0
  assert r["compilation_s"] == r["compile_all_stages_s"]  # stored programs: off in tests
  assert r["sampler_devices"] == 0 and len(r["sample_all_s"]) == 5
  assert r["dtype"] == "bfloat16"
  # The work: the update's forward + backward (6 N per token) and the generation's forwards.
  assert r["work_gflop"] > 8 * r["params"] * r["prompts"] * r["group"] * r["max_new"] / 1e9
  for key in (
    "iteration_s",
    "generate_s",
    "sample_s",
    "train_step_s",
    "compile_s",
    "peak_rss_mb",
    "tokens_per_s",
  ):
    assert r[key] > 0 and math.isfinite(r[key]), key


def test_generation_flops_counts_every_fed_position_and_its_keys():
  """Against a loop over the fed positions: position p (1-based) costs 2 N plus scores and
  values over its p keys in every layer."""
  from types import SimpleNamespace

  cfg = SimpleNamespace(num_heads=4, head_dim=8, num_layers=3)
  N, rows, S, T = 1000, 5, 7, 6
  expected = 0.0
  for p in range(1, S + T):  # the prompt's S positions, then T - 1 sampled tokens fed back
    expected += 2 * N + p * 2 * 2 * cfg.num_heads * cfg.head_dim * cfg.num_layers
  assert bench.generation_flops(N, rows, S, T, cfg) == rows * expected


def test_bench_script_smoke(tmp_path):
  """Twice with one (empty, then filled) compilation cache and stored programs on: the rerun
  loads the sampler and the update without compiling them and computes the same metrics."""

  def bench_once():
    proc = subprocess.run(
      [
        sys.executable,
        "scripts/bench.py",
        "--workload",
        "tiny",
        "--preset",
        "nano",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--max_new",
        "4",
        "--group",
        "2",
        "--prompts",
        "2",
        "--json",
        "--no_peak",
        "--cache_dir",
        str(tmp_path),
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])

  record = bench_once()
  assert record["workload"] == "tiny" and math.isnan(record["mfu"])
  # The tiny workload's layout: the trainer on CPU device 0, the sampler's rows over devices 0
  # and 1; no program compiles after the warm-up there either.
  assert record["devices"] == 2 and record["sampler_devices"] == 2
  assert record["steady_compiles"] == 0 and record["sample_s"] > 0
  # At least the forced-length sampler and the update, compiled for real (an empty cache).
  assert record["executables"]["compiled"] >= 2 and record["executables"]["loaded"] == 0
  assert record["executables"]["cache_served"] == 0
  rerun = bench_once()
  assert rerun["executables"]["loaded"] == record["executables"]["compiled"]
  assert rerun["executables"]["compiled"] == 0 and rerun["executables"]["errors"] == 0
  # The RL loop prefetched them all (the run's manifest) as its first iteration started.
  assert rerun["executables"]["prefetched"] == rerun["executables"]["loaded"]
  assert rerun["last_metrics"] == record["last_metrics"] and record["last_metrics"]
  assert rerun["compilation_s"] > rerun["compile_all_stages_s"]  # loading counted
  bad = subprocess.run(
    [sys.executable, "scripts/bench.py", "--workload", "huge"],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert bad.returncode == 2 and "valid: tiny" in bad.stderr


def test_bench_compare_report_tables(tmp_path, repo_root):
  """The report's main table, ratios and curve tables from made-up records (no runs)."""
  from posttrain_jax.bench import compare as bc

  bc._PEER_ENV.update(bc.TUNED_MALLOC_ENV)
  rec = dict(
    train_step_s=0.1,
    generate_s=0.05,
    mfu=0.3,
    matmul_peak_gflops=250.0,
    decode_gflops=30.0,
    compile_s=4.0,
    steady_compiles=0,
    sample_s=0.04,
    sampler_devices=2,
  )
  results = {
    "tiny": {
      "runs": {
        "ours": [0.1, 0.2, 0.15],
        "trl": [0.3, 0.3, None],
        "ours_generate": [0.05],
        "ours_sample": [0.04],
        "ours_record": [rec],
      },
      "commands": {"ours": "bench.py", "trl": "trl.py"},
    }
  }
  curve = {
    "T": {"ours": [(16, 0.1), (64, 0.3)], "trl": [(16, 0.2), (64, None)]},
    "G": {"ours": [(2, 0.05)], "trl": [(2, 0.1)]},
    "work_gflop": {"T": [(16, 10.0), (64, 50.0)], "G": [(2, 4.0)]},
  }
  text = bc.write_report(str(tmp_path / "bench.md"), results, {"hf_generate": [0.1]}, curve, "cmd")
  assert "| tiny | ours | 3 | 0.150 | 0.100 | 0.200 | — |" in text
  assert "| tiny | trl | 2 | 0.300 | 0.300 | 0.300 | 2.00 |" in text
  assert "MALLOC_ARENA_MAX=1" in text and "ratio 2.00" in text
  assert "our sampler 0.040 s vs HF generate 0.100 s: ratio 2.50" in text
  assert "sampler rows over 2 CPU devices" in text and "sampler alone 0.040 s" in text
  assert "| tiny | ours_sample |" not in text
  assert "| 64 | 0.300 | — | 50.000 |" in text and "| 2 | 0.050 | 0.100 | 4.000 |" in text
  assert "From T = 16 to 64 (4x): work" in text and "5.0x; time ours 3.0x, trl —." in text
  assert (tmp_path / "bench_T.png").exists() and (tmp_path / "bench.json").exists()
