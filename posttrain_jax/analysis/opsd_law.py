"""The OPSD predictive law (arXiv 2605.30070; methods_B.md section 10): the initial gap between
the self-teacher (the policy with a privileged context) and the student predicts the gain of
on-policy self-distillation, linearly across context designs.

    G0 = Acc(pi_0(. | x, c)) - Acc(pi_0(. | x))          (measured before training)
    Delta = Acc(pi_T(. | x)) - Acc(pi_0(. | x))          (after a fixed budget)
    Delta ~ a * G0 + b                                   (the fit protocol is derived)

:func:`initial_gap` estimates G0 from per-problem correctness; :func:`fit_law` fits the line
over configurations and reports its slope, intercept, R² and the leave-one-configuration-out
prediction error; :func:`law_points` reads a reproduction's runs.
"""

import json
import math
import os

import numpy as np


def initial_gap(with_context, without_context) -> tuple[float, float]:
  """``(G0, standard error)`` from per-sample correctness (0/1 or pass rates) of the policy with
  and without the context on the same problems: the difference of the means, an unbiased
  estimate of the accuracy gap. Its standard error is that of the paired differences."""
  a = np.asarray(with_context, np.float64)
  b = np.asarray(without_context, np.float64)
  if a.shape != b.shape or a.size == 0:
    raise ValueError(f"initial_gap needs paired, non-empty samples, got {a.shape} and {b.shape}")
  d = a - b
  se = float(d.std(ddof=1) / math.sqrt(d.size)) if d.size > 1 else math.nan
  return float(d.mean()), se


def _line(x, y) -> tuple[float, float]:
  """Least-squares (slope, intercept); a flat line through the mean when x does not vary."""
  if np.ptp(x) == 0:
    return 0.0, float(np.mean(y))
  slope, intercept = np.polyfit(x, y, 1)
  return float(slope), float(intercept)


def fit_law(g0, delta) -> dict:
  """Least-squares ``delta = slope * g0 + intercept`` over configurations, with R² and the
  leave-one-configuration-out RMSE (each point predicted by the line fitted to the others).
  When the gaps do not vary the line is flat (slope 0) and R² is NaN: no law can be read.

  Args:
    g0: [C] initial gaps, one per configuration.
    delta: [C] gains.
  Returns:
    dict of slope, intercept, r2, loco_rmse, n.
  """
  x, y = np.asarray(g0, np.float64), np.asarray(delta, np.float64)
  if x.shape != y.shape or x.size < 3:
    raise ValueError(f"fit_law needs at least 3 paired configurations, got {x.size}")
  slope, intercept = _line(x, y)
  residual = y - (slope * x + intercept)
  total = np.sum((y - y.mean()) ** 2)
  r2 = float(1.0 - np.sum(residual**2) / total) if total > 0 and np.ptp(x) > 0 else math.nan
  errors = []
  for i in range(x.size):
    keep = np.arange(x.size) != i
    s, b = _line(x[keep], y[keep])
    errors.append(y[i] - (s * x[i] + b))
  return {
    "slope": slope,
    "intercept": intercept,
    "r2": r2,
    "loco_rmse": float(np.sqrt(np.mean(np.square(errors)))),
    "n": int(x.size),
  }


TEACHER_FIRST, STUDENT_FIRST = "rl_first/eval/teacher_accuracy", "rl_first/eval/accuracy"


def run_gap(run: dict) -> float:
  """G0 of one run of runs.jsonl: from its summary's first RL evaluation (``rl_first/...``,
  config.eval.rl_summary holds eval/teacher_accuracy and eval/accuracy) when recorded, else
  from the run's workdir (:func:`step0_gap`)."""
  if TEACHER_FIRST in run and STUDENT_FIRST in run:
    return float(run[TEACHER_FIRST]) - float(run[STUDENT_FIRST])
  return step0_gap(run["workdir"])


def step0_gap(workdir: str) -> float:
  """G0 of one run: ``eval/teacher_accuracy - eval/accuracy`` in its RL stage's step-0
  evaluation (greedy, the same held-out problems with and without the context)."""
  with open(os.path.join(workdir, "rl", "metrics.jsonl"), encoding="utf-8") as f:
    first = json.loads(f.readline())
  if first.get("step") != 0 or "eval/teacher_accuracy" not in first:
    raise ValueError(
      f"{workdir}: the RL stage's first record is not a step-0 evaluation with "
      "the context (config.rl.eval_every > 0 and a teacher context are needed)"
    )
  return float(first["eval/teacher_accuracy"]) - float(first["eval/accuracy"])


def law_points(runs_jsonl: str, arms) -> list[dict]:
  """Per arm (configuration) of a reproduction: the mean G0 and mean Delta over its seeds
  (``runs.jsonl`` of scripts/reproduce.py), with the per-seed values."""
  with open(runs_jsonl, encoding="utf-8") as f:
    runs = [json.loads(line) for line in f]
  points = []
  for arm in arms:
    rows = [r for r in runs if r["arm"] == arm]
    if not rows:
      continue
    g0 = [run_gap(r) for r in rows]
    delta = [r["accuracy_after_rl"] - r["accuracy_before_rl"] for r in rows]
    points.append(
      {
        "arm": arm,
        "seeds": len(rows),
        "g0": float(np.mean(g0)),
        "delta": float(np.mean(delta)),
        "g0_runs": g0,
        "delta_runs": delta,
      }
    )
  return points
