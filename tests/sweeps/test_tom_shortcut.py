"""scripts/tom_shortcut.py: the last-mention shortcut scored on a ToM config's eval sets, and the
runs that score exactly as it does."""

import json
import os

import pytest

from posttrain_jax.sweeps import tom_shortcut

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _script():
  return tom_shortcut


def test_shortcut_scores_and_the_runs_that_match_it(tmp_path, monkeypatch):
  from posttrain_jax.envs import tom
  from posttrain_jax.sweeps import runner
  from posttrain_jax.train import context

  script = _script()
  config = str(tmp_path / "tom_small.py")  # experiments/tom.py with 60 problems a set
  with open(config, "w", encoding="utf-8") as f:
    f.write(
      f"import sys\nsys.path.insert(0, {os.path.join(ROOT, 'experiments')!r})\n"
      "import tom\n\n\ndef get_config(arg=None):\n"
      "  c = tom.get_config(arg)\n  c.eval.num_problems = 60\n  return c\n"
    )
  sets = context.eval_sets(runner.load_config_module(config).get_config("arm=rl_answer"))
  acc = {
    n: sum(tom.last_mentioned(p.prompt) == p.answer for p in ps) / len(ps)
    for n, (_, ps) in sets.items()
  }
  # the shortcut split plants the last box 95% of the time; the others give it chance (1 in 4)
  assert acc["train"] == pytest.approx(0.95, abs=0.08)
  assert all(0.05 < acc[n] < 0.5 for n in ("heldout", "tom_order3", "tom_counterfactual"))
  as_shortcut = {script.metric(n, w): acc[n] for n in acc for w in ("before", "after")}
  off = dict(as_shortcut, accuracy_tom_order3_after_rl=acc["tom_order3"] + 0.1)
  runs = [
    dict(as_shortcut, arm="rl_answer", seed=0),
    dict(off, arm="rl_answer", seed=1),
    dict(off, arm="rl_think", seed=0),
  ]
  (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
  monkeypatch.setattr("sys.argv", ["tom_shortcut.py", str(tmp_path), config])
  assert script.main() == 0
  rows = {
    line.split(" | ")[0].strip("| "): line.split(" | ")
    for line in (tmp_path / "shortcut.md").read_text().splitlines()
    if line.startswith("| rl_")
  }
  assert rows["rl_answer"][1] == "2" and rows["rl_answer"][-2:] == ["2", "1 |"]
  assert rows["rl_think"][-2:] == ["1", "0 |"]  # before RL as the shortcut, after RL not
  assert "sft" not in rows  # an arm without runs gets no row
  assert float(rows["rl_answer"][4]) == pytest.approx(acc["tom_order3"], abs=1e-4)


def test_metric_names_follow_the_eval_stage():
  script = _script()
  assert script.metric("train", "after") == "accuracy_after_rl"
  assert script.metric("heldout", "before") == "accuracy_heldout_before_rl"
  assert script.metric("tom_order3", "after") == "accuracy_tom_order3_after_rl"
