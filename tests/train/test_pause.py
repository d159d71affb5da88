"""config.rl.pause_after: a run paused at a step and continued later writes exactly the records
of the uninterrupted run (the promotion of a trial between rungs, sweeps/hpo.py)."""

import json
import os

import rl_fixtures as fx

from posttrain_jax import methods as methods_lib


def test_a_paused_run_continued_equals_the_uninterrupted_run(tmp_path):
  full = fx.run(tmp_path / "full", fx.smoke_config(4))
  paused = fx.smoke_config(4)
  paused.rl.pause_after = 2
  summary = methods_lib.run(paused, str(tmp_path / "cut"))
  assert summary == {"paused_stage": "rl", "paused_step": 2}
  assert [r["step"] for r in fx.records(tmp_path / "cut")] == [1, 2]
  assert not os.path.exists(tmp_path / "cut" / "rl" / "done.json")
  with open(tmp_path / "cut" / "paused.json") as f:
    assert json.load(f) == summary
  # the same pause again resumes nothing; 0 (or a larger pause) continues to the end
  assert methods_lib.run(paused, str(tmp_path / "cut"))["paused_step"] == 2
  paused.rl.pause_after = 0
  resumed = fx.run(tmp_path / "cut", paused)
  fx.assert_same_records(full, resumed, "pause")
  assert not os.path.exists(tmp_path / "cut" / "paused.json")
