"""SVEB's scores of a state-value estimator (arXiv 2605.29782; methods_B.md section 12, derived):
how close its values of partial responses come to their Monte-Carlo ground truth.

For states ``s = (x, y_<t)`` (a prompt and a prefix of one of its sampled responses), the
ground truth ``V*(s)`` is the mean reward of ``M`` continuations sampled from ``s``
(``train/value_benchmark.py`` samples them with the library's own sampler). An estimator's
values ``V(s)`` of the same states are scored by

- ``mse``: ``mean (V(s) - V*(s))^2``;
- ``spearman``: the rank correlation of ``V`` and ``V*`` over all states (NaN when either is
  constant);
- ``collapse``: the share of the estimator's variance explained by the prompt alone,
  ``sum_x n_x (mean_x V - mean V)^2 / sum_s (V(s) - mean V)^2`` (1: its values depend on the
  prompt only, the collapse of PPO critics to the group average the paper reports; NaN for a
  constant estimator).
"""

import numpy as np
from scipy import stats


def collapse(values, prompts) -> float:
  """Share of the variance of ``values`` [N] between the groups ``prompts`` [N]."""
  values, prompts = np.asarray(values, np.float64), np.asarray(prompts)
  total = np.sum(np.square(values - values.mean()))
  if total <= 0:
    return float("nan")
  between = 0.0
  for p in np.unique(prompts):
    v = values[prompts == p]
    between += len(v) * (v.mean() - values.mean()) ** 2
  return float(between / total)


def score(values, truth, prompts) -> dict:
  """``{mse, spearman, collapse}`` of an estimator's ``values`` [N] against ``truth`` [N]
  (``V*``) on states of the prompts ``prompts`` [N]."""
  values, truth = np.asarray(values, np.float64), np.asarray(truth, np.float64)
  if values.shape != truth.shape or values.ndim != 1 or not len(values):
    raise ValueError(f"values {values.shape} and ground truth {truth.shape} must be equal [N]")
  constant = values.std() == 0 or truth.std() == 0
  rho = float("nan") if constant else float(stats.spearmanr(values, truth).statistic)
  return {
    "mse": float(np.mean(np.square(values - truth))),
    "spearman": rho,
    "collapse": collapse(values, prompts),
  }
