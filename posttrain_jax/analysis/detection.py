"""Scores that separate two sets of items (a probe's, a detector's): AUROC and the true-positive
rate at a fixed false-positive rate, from scikit-learn's ROC computation.

``scores`` [N] (higher: more likely positive), ``labels`` [N] in {0, 1}. Both sets must be
present (a clear ValueError otherwise). :func:`tpr_at_fpr` reads the ROC curve at the largest
threshold whose FPR does not exceed ``fpr`` (the conservative operating point; no
interpolation).
"""

import numpy as np
from sklearn import metrics


def _check(scores, labels) -> tuple[np.ndarray, np.ndarray]:
  scores = np.asarray(scores, np.float64).reshape(-1)
  labels = np.asarray(labels).reshape(-1)
  if scores.shape != labels.shape:
    raise ValueError(f"{scores.shape[0]} scores for {labels.shape[0]} labels")
  if not np.isin(labels, (0, 1)).all():
    raise ValueError("labels must be 0 (negative) or 1 (positive)")
  if labels.min() == labels.max():
    raise ValueError("AUROC needs both positive and negative items; the labels hold one class")
  if not np.isfinite(scores).all():
    raise ValueError("scores hold NaN or infinity; a detector's score must be finite")
  return scores, labels.astype(np.int64)


def auroc(scores, labels) -> float:
  """The area under the ROC curve: P(score of a positive > score of a negative), ties 1/2."""
  scores, labels = _check(scores, labels)
  return float(metrics.roc_auc_score(labels, scores))


def tpr_at_fpr(scores, labels, fpr: float = 0.05) -> float:
  """The true-positive rate at the last ROC point with false-positive rate <= ``fpr``."""
  if not 0.0 <= fpr <= 1.0:
    raise ValueError(f"fpr must lie in [0, 1], got {fpr}")
  scores, labels = _check(scores, labels)
  f, t, _ = metrics.roc_curve(labels, scores)
  return float(t[f <= fpr].max())
