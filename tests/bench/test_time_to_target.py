"""The time-to-target workload: its bookkeeping, and one short race from an exported checkpoint
(no timing asserted)."""

import json
import os
import subprocess
import sys

import pytest

from posttrain_jax import methods as methods_lib
from posttrain_jax.bench import time_to_target as ttt

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_first_reached_and_summary():
  curve = [
    {"step": 0, "seconds": 0.0, "accuracy": 0.5},
    {"step": 5, "seconds": 2.0, "accuracy": 0.65},
    {"step": 10, "seconds": 3.0, "accuracy": 0.55},
    {"step": 15, "seconds": 4.5, "accuracy": 0.85},
  ]
  got = ttt.first_reached(curve, (0.6, 0.8, 0.9))
  assert got == {
    "0.6": {"seconds": 2.0, "step": 5},
    "0.8": {"seconds": 4.5, "step": 15},
    "0.9": None,
  }
  assert ttt.first_reached(curve, (0.5,))["0.5"] == {"seconds": 0.0, "step": 0}
  rec = lambda seed, s, step: {
    "seed": seed,
    "target": 0.6,
    "seconds_to_target": s,
    "reached": {"0.6": None if s is None else {"seconds": s, "step": step}},
    "iteration_s": 0.1,
    "setup_s": 1.0,
  }
  summary = ttt.summarize([rec(0, 3.0, 5), rec(1, 1.0, 10), rec(2, None, None)])
  assert summary["median_seconds_to_target"] == 3.0 and summary["reached"] == 2
  assert summary["median_steps_to_target"] == 10
  # Most seeds never reached it: no median.
  assert (
    ttt.summarize([rec(0, None, None), rec(1, None, None), rec(2, 1.0, 5)])[
      "median_seconds_to_target"
    ]
    is None
  )


@pytest.fixture(scope="module")
def pretrained_run(tmp_path_factory):
  """The quickstart's smoke pretraining (nano model, a few steps): a run workdir to export."""
  from posttrain_jax.sweeps.reproduce import load_config_module

  module = load_config_module(os.path.join(REPO, "experiments", "quickstart.py"))
  c = module.get_config("smoke")
  c.stages = ("pretrain",)
  c.progress = False
  workdir = str(tmp_path_factory.mktemp("ttt_pretrain"))
  methods_lib.run(c, workdir)
  return workdir


def test_race_from_the_exported_checkpoint(pretrained_run, tmp_path):
  hf_dir = ttt.prepare(str(tmp_path / "cache"), source=pretrained_run, eval_problems=16)
  with open(tmp_path / "cache" / ttt.PROBLEMS_FILE, encoding="utf-8") as f:
    problems = json.load(f)
  assert len(problems["heldout"]) == 16 and len(problems["train"]) == ttt.TRAIN_POOL
  heldout = {r["prompt"] for r in problems["heldout"]}
  assert not heldout & {r["prompt"] for r in problems["train"][:2000]}  # disjoint splits
  assert problems["hyperparameters"]["prompts"] == 16 and problems["hyperparameters"]["beta"] == 0
  # An unreachable threshold: the race runs max_steps, evaluating every eval_every steps.
  r = ttt.run_ours(hf_dir, 0, thresholds=(0.99, 1.01), eval_every=1, max_steps=2, eval_problems=16)
  assert [p["step"] for p in r["curve"]] == [0, 1, 2]
  assert r["steps"] == 2 and r["reached"]["1.01"] is None and r["seconds_to_target"] is None
  assert r["curve"][0]["accuracy"] == r["start_accuracy"]
  assert r["curve"][2]["seconds"] > r["curve"][1]["seconds"] > 0
  # A threshold met at the start: no step is taken.
  r0 = ttt.run_ours(hf_dir, 0, thresholds=(0.0,), eval_every=1, max_steps=2, eval_problems=16)
  assert r0["steps"] == 0 and r0["seconds_to_target"] == 0.0
  with pytest.raises(ValueError, match="eval_every"):
    ttt.run_ours(hf_dir, 0, eval_every=0)
  assert r["batch_widths"] == [6]  # the standard budget: nothing to trim
  # A generous budget: the answers still end at EOS, and the update runs on the trimmed width.
  r32 = ttt.run_ours(
    hf_dir, 0, thresholds=(1.01,), eval_every=1, max_steps=1, eval_problems=16, max_new=32
  )
  assert r32["hyperparameters"]["max_new"] == 32 and r32["steps"] == 1
  assert r32["batch_widths"] and set(r32["batch_widths"]) <= {16, 32}
  with pytest.raises(ValueError, match="max_new must be >= 1"):
    ttt.run_ours(hf_dir, 0, max_new=0)
  # The folder is reused for the same request (or any source), refused for another.
  assert ttt.prepare(str(tmp_path / "cache"), source=pretrained_run, eval_problems=16) == hf_dir
  assert ttt.prepare(str(tmp_path / "cache"), eval_problems=16) == hf_dir
  with pytest.raises(ValueError, match="with 16 held-out problems, not from any source with 500"):
    ttt.prepare(str(tmp_path / "cache"))
  with pytest.raises(ValueError, match="delete the folder"):
    ttt.prepare(str(tmp_path / "cache"), source=str(tmp_path), eval_problems=16)


def test_prepare_without_a_pretrain_stage_is_a_clear_error(tmp_path):
  (tmp_path / "run").mkdir()
  with pytest.raises(FileNotFoundError, match="no finished pretrain stage"):
    ttt.prepare(str(tmp_path / "cache"), source=str(tmp_path / "run"))


def test_bench_script_time_to_target_smoke(pretrained_run, tmp_path):
  proc = subprocess.run(
    [
      sys.executable,
      "scripts/bench.py",
      "--workload",
      "time_to_target",
      "--seeds",
      "0",
      "--ttt_dir",
      str(tmp_path / "cache"),
      "--ttt_source",
      pretrained_run,
      "--max_steps",
      "1",
      "--eval_every",
      "1",
      "--json",
      "--cache_dir",
      "",
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["workload"] == "time_to_target" and out["seeds"] == [0]
  assert os.path.isfile(os.path.join(out["checkpoint"], "config.json"))
  assert out["records"][0]["steps"] <= 1


def test_time_to_target_report(tmp_path):
  from posttrain_jax.bench import compare as bc

  rec = lambda s, step: {
    "start_accuracy": 0.55,
    "iteration_s": 0.1,
    "first_iteration_s": 2.0,
    "setup_s": 1.0,
    "reached": {"0.6": {"seconds": s, "step": step}, "0.9": None},
  }
  race = {
    "seeds": [0, 1],
    "ours_cold": [rec(4.0, 5), rec(6.0, 5)],
    "ours_warm": [rec(1.0, 5), None],
    "trl": [rec(2.0, 5), rec(3.0, 10)],
    "commands": {"ours": "bench.py", "trl": "trl.py"},
  }
  text = bc.write_ttt_report(str(tmp_path / "ttt.md"), race, "cmd")
  assert "| 0 | ours_cold | 0.550 | 4.00 (5) | not reached | 0.100 | 2.00 | 1.00 |" in text
  assert "| 1 | ours_warm | failed |" in text
  # Medians 5.0 (cold), inf (warm: one seed failed), 2.5 (TRL).
  assert "| 0.6 | 5.00 | inf | 2.50 | 0.50 | — |" in text
  assert (tmp_path / "ttt.json").exists()
