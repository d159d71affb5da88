"""Small-sample statistics for reproduction tables: t confidence intervals, the paired t-test
and an exact paired sign-flip test (no scipy needed)."""

import itertools
import math

import numpy as np

# Two-sided 95% critical values of Student's t for df = 1..30 (standard table values).
_T975 = [
  12.706,
  4.303,
  3.182,
  2.776,
  2.571,
  2.447,
  2.365,
  2.306,
  2.262,
  2.228,
  2.201,
  2.179,
  2.160,
  2.145,
  2.131,
  2.120,
  2.110,
  2.101,
  2.093,
  2.086,
  2.080,
  2.074,
  2.069,
  2.064,
  2.060,
  2.056,
  2.052,
  2.048,
  2.045,
  2.042,
]


def t_critical_975(df: int) -> float:
  """The 97.5% quantile of Student's t with ``df`` degrees of freedom (1.96 beyond 30)."""
  if df < 1:
    return math.nan
  return _T975[df - 1] if df <= 30 else 1.96


def mean_ci(values) -> tuple[float, float]:
  """(mean, half-width of the 95% t interval); half-width is nan for fewer than 2 values."""
  x = np.asarray(values, np.float64)
  if x.size == 0:
    return math.nan, math.nan
  if x.size < 2:
    return float(x.mean()), math.nan
  return float(x.mean()), float(t_critical_975(x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))


def paired_sign_flip_p(
  a, b, *, max_exact: int = 16, num_random: int = 20000, seed: int = 0
) -> float:
  """Two-sided p-value of the paired differences ``a - b`` under random sign flips.

  Exact enumeration of all 2^n flips for n <= ``max_exact``, Monte Carlo beyond.
  """
  d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
  n = d.size
  if n == 0:
    return math.nan
  observed = abs(d.mean())
  if n <= max_exact:
    signs = np.array(list(itertools.product([1.0, -1.0], repeat=n)))
  else:
    signs = np.random.default_rng(seed).choice([1.0, -1.0], size=(num_random, n))
  stats = np.abs((signs * d).mean(axis=1))
  return float(np.mean(stats >= observed - 1e-12))


def t_sf_two_sided(t: float, df: int) -> float:
  """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom (Simpson integration)."""
  if df < 1 or not math.isfinite(t):
    return math.nan if not math.isfinite(t) and not math.isinf(t) else 0.0
  t = abs(t)
  log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
  xs = np.linspace(0.0, t, 4001)
  pdf = np.exp(log_c - (df + 1) / 2 * np.log1p(xs**2 / df))
  h = xs[1] - xs[0] if t > 0 else 0.0
  area = h / 3 * (pdf[0] + pdf[-1] + 4 * pdf[1:-1:2].sum() + 2 * pdf[2:-1:2].sum())
  return float(min(max(1.0 - 2.0 * area, 0.0), 1.0))


def paired_t_test(a, b) -> tuple[float, float, float]:
  """(mean of a - b, 95% CI half-width, two-sided p) of the paired t-test."""
  d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
  mean, half = mean_ci(d)
  if d.size < 2:
    return mean, half, math.nan
  sd = d.std(ddof=1)
  if sd == 0:
    return mean, 0.0, (1.0 if mean == 0 else 0.0)
  return mean, half, t_sf_two_sided(mean / (sd / math.sqrt(d.size)), d.size - 1)


def t_quantile(q: float, df: int) -> float:
  """The ``q`` quantile (0.5 <= q < 1) of Student's t with ``df`` degrees of freedom, by
  bisection on :func:`t_sf_two_sided` (P(T > t) = sf / 2)."""
  if not 0.5 <= q < 1 or df < 1:
    return math.nan
  lo, hi = 0.0, 1000.0
  for _ in range(60):
    mid = (lo + hi) / 2
    if t_sf_two_sided(mid, df) / 2 > 1 - q:
      lo = mid
    else:
      hi = mid
  return (lo + hi) / 2


def detectable_effect(a, b, *, power: float = 0.8) -> float:
  """The smallest mean paired difference ``a - b`` that a two-sided paired t-test at the 5%
  level detects with probability ``power``, given the spread of the observed differences:
  ``(t_{0.975, n-1} + t_{power, n-1}) * sd / sqrt(n)``. NaN for fewer than 2 pairs."""
  d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
  if d.size < 2:
    return math.nan
  df = d.size - 1
  return float((t_quantile(0.975, df) + t_quantile(power, df)) * d.std(ddof=1) / math.sqrt(d.size))
