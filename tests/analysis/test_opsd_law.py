"""The OPSD law's estimators (analysis/opsd_law.py): the gap estimate and the line fit."""

import json

import numpy as np
import pytest

from posttrain_jax.analysis import opsd_law as law


def test_initial_gap_is_unbiased_on_a_bernoulli_fixture():
  """Accuracies 0.7 with the context and 0.4 without: the estimate's mean over many draws is
  the true gap 0.3, and its standard error matches the spread of the estimates."""
  rng = np.random.default_rng(0)
  estimates, ses = [], []
  for _ in range(2000):
    with_c = rng.random(50) < 0.7
    without = rng.random(50) < 0.4
    g, se = law.initial_gap(with_c, without)
    estimates.append(g)
    ses.append(se)
  assert np.mean(estimates) == pytest.approx(0.3, abs=0.005)
  assert np.mean(ses) == pytest.approx(np.std(estimates), rel=0.1)
  assert law.initial_gap([1, 0, 1], [1, 0, 1])[0] == 0.0  # an empty context: G0 = 0


def test_fit_recovers_planted_coefficients_and_scores_them():
  rng = np.random.default_rng(1)
  g0 = np.linspace(-0.1, 0.6, 8)
  exact = law.fit_law(g0, 0.5 * g0 + 0.02)
  assert (exact["slope"], exact["intercept"], exact["r2"]) == pytest.approx((0.5, 0.02, 1.0))
  assert exact["loco_rmse"] == pytest.approx(0.0, abs=1e-12)
  noisy = law.fit_law(g0, 0.5 * g0 + 0.02 + rng.normal(0, 0.02, 8))
  assert noisy["slope"] == pytest.approx(0.5, abs=0.1) and 0.8 < noisy["r2"] < 1.0
  assert noisy["loco_rmse"] > 0.0
  flat = law.fit_law(g0, rng.normal(0, 0.05, 8))  # no relation: R² near 0
  assert flat["r2"] < 0.5
  same = law.fit_law([0.0, 0.0, 0.0], [0.1, 0.0, 0.2])  # gaps that do not vary: no law
  assert same["slope"] == 0.0 and np.isnan(same["r2"])
  with pytest.raises(ValueError, match="at least 3"):
    law.fit_law([0.1, 0.2], [0.0, 0.1])


def test_law_points_read_step0_gaps_and_gains(tmp_path):
  runs = []
  for arm, gap, gain in (("k1", 0.1, 0.05), ("k4", 0.5, 0.2)):
    for seed in range(2):
      wd = tmp_path / f"{arm}{seed}"
      (wd / "rl").mkdir(parents=True)
      (wd / "rl" / "metrics.jsonl").write_text(
        json.dumps(
          {"step": 0, "eval/accuracy": 0.2, "eval/teacher_accuracy": 0.2 + gap + 0.01 * seed}
        )
        + "\n"
      )
      runs.append(
        {
          "arm": arm,
          "seed": seed,
          "workdir": str(wd),
          "accuracy_before_rl": 0.3,
          "accuracy_after_rl": 0.3 + gain,
        }
      )
  path = tmp_path / "runs.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in runs))
  points = law.law_points(str(path), ["k1", "k4", "missing"])
  assert [p["arm"] for p in points] == ["k1", "k4"]
  assert points[1]["g0"] == pytest.approx(0.505) and points[1]["delta"] == pytest.approx(0.2)


def test_law_script_writes_the_fit_and_its_plot(tmp_path):
  """scripts/opsd_law.py's report on runs whose gains are 0.5 G0: slope 0.5, R² 1."""
  import os
  import runpy

  script = runpy.run_path(
    os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "opsd_law.py")
  )
  runs = []
  for arm, gap in (("k0", 0.0), ("k2", 0.2), ("k4", 0.4)):
    wd = tmp_path / arm
    (wd / "rl").mkdir(parents=True)
    (wd / "rl" / "metrics.jsonl").write_text(
      json.dumps({"step": 0, "eval/accuracy": 0.1, "eval/teacher_accuracy": 0.1 + gap}) + "\n"
    )
    runs.append(
      {
        "arm": arm,
        "seed": 0,
        "workdir": str(wd),
        "accuracy_before_rl": 0.1,
        "accuracy_after_rl": 0.1 + 0.5 * gap,
      }
    )
  (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
  text = script["write_law"](str(tmp_path), ("k0", "k2", "k4"), 1, "cmd")
  assert "Delta = 0.500 G0 + " in text and "R² = 1.000" in text
  assert "a positive linear relation" in text
  assert (tmp_path / "law.png").stat().st_size > 1000


def test_law_points_read_g0_from_the_committed_summary_when_recorded(tmp_path):
  """G0 from runs.jsonl's rl_first/... keys: no workdir needed (it is not committed)."""
  runs = [
    {
      "arm": "k4",
      "seed": s,
      "workdir": str(tmp_path / "gone"),
      law.TEACHER_FIRST: 0.7 + 0.1 * s,
      law.STUDENT_FIRST: 0.3,
      "accuracy_before_rl": 0.3,
      "accuracy_after_rl": 0.5,
    }
    for s in range(2)
  ]
  path = tmp_path / "runs.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in runs))
  (point,) = law.law_points(str(path), ["k4"])
  assert point["g0_runs"] == pytest.approx([0.4, 0.5]) and point["g0"] == pytest.approx(0.45)
