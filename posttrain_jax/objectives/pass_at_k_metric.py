"""Evaluation estimators for sampled correctness (Chen et al. 2021, "Evaluating LLMs trained on code")."""

import numpy as np


def pass_at_k(num_samples: np.ndarray, num_correct: np.ndarray, k: int) -> np.ndarray:
  """Unbiased pass@k per problem: 1 - C(n - c, k) / C(n, k).

  Args:
    num_samples: [P] int, samples drawn per problem (n >= k).
    num_correct: [P] int, correct samples among them (c).
    k: the K of pass@K.

  Returns:
    [P] float64 estimates in [0, 1]. Computed as a running product for numerical stability.
  """
  n = np.asarray(num_samples, dtype=np.int64)
  c = np.asarray(num_correct, dtype=np.int64)
  if np.any(n < k):
    raise ValueError(f"pass@{k} needs at least {k} samples per problem, got min {n.min()}")
  if np.any((c < 0) | (c > n)):
    raise ValueError("num_correct must lie in [0, num_samples]")
  out = np.empty(n.shape, dtype=np.float64)
  for i, (ni, ci) in enumerate(zip(n.ravel(), c.ravel())):
    if ni - ci < k:
      out.flat[i] = 1.0
    else:
      # C(n-c, k)/C(n, k) = prod_{j=n-c+1}^{n} (1 - k/j)
      out.flat[i] = 1.0 - np.prod(1.0 - k / np.arange(ni - ci + 1, ni + 1))
  return out
