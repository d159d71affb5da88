import itertools
from math import comb

import numpy as np
import pytest

from posttrain_jax import objectives


def test_matches_combinatorial_formula():
  for n in range(1, 9):
    for c in range(n + 1):
      for k in range(1, n + 1):
        expected = 1 - comb(n - c, k) / comb(n, k)
        np.testing.assert_allclose(objectives.pass_at_k([n], [c], k)[0], expected, rtol=1e-12)


def test_unbiased_by_enumeration():
  """E over all outcomes of n Bernoulli(p) samples of the estimate equals 1 - (1 - p)^k."""
  n, k, p = 6, 3, 0.3
  total = 0.0
  for outcome in itertools.product([0, 1], repeat=n):
    c = sum(outcome)
    prob = p**c * (1 - p) ** (n - c)
    total += prob * objectives.pass_at_k([n], [c], k)[0]
  np.testing.assert_allclose(total, 1 - (1 - p) ** k, rtol=1e-12)


def test_bad_input():
  with pytest.raises(ValueError, match="at least 4"):
    objectives.pass_at_k([3], [1], 4)
