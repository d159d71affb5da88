"""Pilots (sweeps/pilot.py): the runs get the pilot's overrides, its JSON keeps each arm's
summary and RL curve, and pilots.md is rendered from the JSON files with the mechanism check."""

import json
import os
import re

import pytest

from posttrain_jax.sweeps import pilot

CONFIG = "experiments/echorl.py"


class _Backend:
  """Runs nothing: writes each job's summary and RL metrics, recording the job."""

  def __init__(self):
    self.jobs = []

  def describe(self):
    return "fake backend"

  def map(self, jobs, log_dir):
    for job in jobs:
      self.jobs.append(job)
      os.makedirs(os.path.join(job.workdir, "rl"), exist_ok=True)
      arm = job.config_arg.split(",")[0].split("=")[1]
      frac = {"grpo": 0.0, "echorl": 0.25}[arm]
      summary = {
        "seed": 0,
        "accuracy_before_rl": 0.5,
        "accuracy_after_rl": 0.6 + frac,
        "rl_mean/echo/degenerate_frac": frac,
      }
      with open(os.path.join(job.workdir, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f)
      with open(os.path.join(job.workdir, "rl", "metrics.jsonl"), "w", encoding="utf-8") as f:
        for step in (1, 2):
          row = {"step": step, "echo/degenerate_frac": frac * step, "loss/pg": 1.0}
          f.write(json.dumps(row) + "\n")
      yield job, 0, 1.0


def test_a_pilot_runs_its_overrides_and_renders_its_rows(tmp_path, monkeypatch):
  backend = _Backend()
  monkeypatch.setattr(pilot, "make_pool", lambda *a: (backend, 1))
  over = ("--config.env.level=2", "--config.rl.temperature=0.7")
  text = pilot.run_pilot(
    CONFIG, "lvl2", "level 2", overrides=over, arms=["grpo", "echorl"], out_dir=str(tmp_path)
  )
  # Every job, the shared base included, ran with the pilot's overrides.
  assert [j.name for j in backend.jobs] == ["seed0_base", "seed0_grpo", "seed0_echorl"]
  assert all(j.overrides[-2:] == over for j in backend.jobs)
  data = json.loads((tmp_path / "lvl2_seed0.json").read_text())
  assert data["meta"]["overrides"] == list(over) and data["meta"]["arms"] == ["grpo", "echorl"]
  assert data["echorl"]["accuracy_after_rl"] == 0.85
  # The curve keeps the config's eval.rl_summary metrics, not the rest.
  assert data["echorl_curve"] == [
    {"step": 1, "echo/degenerate_frac": 0.25},
    {"step": 2, "echo/degenerate_frac": 0.5},
  ]
  rows = [r for r in text.splitlines() if r.startswith("| level 2")]
  assert rows[0].split(" | ")[2] == "grpo" and "0.6000" in rows[0]
  assert rows[1].endswith("yes (rl_mean/echo/degenerate_frac 0.2500 vs > 0.1) |")
  assert (tmp_path / "pilots.md").read_text() == text
  assert "--config.env.level=2 --config.rl.temperature=0.7" in text


def test_the_mechanism_check_reads_the_declared_threshold():
  sweep = pilot.sweep_of(pilot.load_config_module(CONFIG))
  assert pilot.engaged_line(sweep, {"rl_mean/echo/degenerate_frac": 0.05}).startswith("no")
  assert pilot.engaged_line(sweep, {"rl_mean/echo/degenerate_frac": 0.2}).startswith("yes")
  assert pilot.engaged_line(sweep, {"rl_mean/echo/degenerate_frac": float("nan")}).startswith("no")
  assert pilot.engaged_line(sweep, {}) == ""
  assert "rl_max/echo/degenerate_frac" in pilot.columns(sweep)


@pytest.mark.parametrize(
  "kwargs, message",
  [
    (dict(arms=["nope"]), "no arm(s) ['nope']"),
    (dict(overrides=("env.level=2",)), "--config.KEY=VALUE"),
    (dict(name="a b"), "pilot name"),
  ],
)
def test_bad_pilot_requests_name_the_problem(tmp_path, kwargs, message):
  name = kwargs.pop("name", "ok")
  with pytest.raises(ValueError, match=re.escape(message)):
    pilot.run_pilot(CONFIG, name, "x", out_dir=str(tmp_path), **kwargs)


def test_the_committed_pilots_table_is_rendered_from_its_files(tmp_path):
  """results/echorl/pilots/pilots.md is what render makes from the JSON beside it."""
  folder = os.path.join("results", "echorl", "pilots")
  sweep = pilot.sweep_of(pilot.load_config_module(CONFIG))
  for name in os.listdir(folder):
    if name.endswith(".json"):
      (tmp_path / name).write_text(open(os.path.join(folder, name), encoding="utf-8").read())
  text = pilot.render(str(tmp_path), CONFIG, sweep)
  assert text == open(os.path.join(folder, "pilots.md"), encoding="utf-8").read()
