"""JF-HPO's early-stopping rules on an RL trial's training curve (methods_A.md section 12).

Each rule reads the RL records of a trial so far (``rl/metrics.jsonl``: one dict per step) and
returns the reason to stop it, or None. A study (sweeps/hpo.py) checks the rules a trial's
``hpo.early_stop`` section names after each of its rungs and prunes the trial with the first
reason found. The rules and their thresholds are derived (the paper names the signals, not the
numbers); every threshold is a keyword of its rule, so a study can change it by config::

    early_stop=dict(
      reward_falling=dict(window=20, min_slope=0.0, warmup=10),
      entropy_collapsed=dict(floor=0.05, warmup=10),
      length_blowup=dict(factor=3.0),
      grad_spike=dict(limit=100.0),
      kl_spike=dict(limit=1.0),
      nonfinite=dict(),
    )
"""

import math

import numpy as np

REWARD, ENTROPY, LENGTH = "reward/mean", "policy/entropy", "gen/len_mean"
GRAD_NORM, NONFINITE = "train/grad_norm", "train/nonfinite"
KL_KEYS = ("kl/mean", "loss/kl", "mismatch/k3")  # the first a record has


def _series(records: list[dict], key: str) -> np.ndarray:
  return np.array([float(r[key]) for r in records if r.get("step", 1) > 0 and key in r])


def slope(values: np.ndarray) -> float:
  """Least-squares slope of ``values`` against their index (per step)."""
  x = np.arange(len(values), dtype=np.float64)
  return float(np.polyfit(x, values, 1)[0])


def reward_falling(records, *, window: int = 20, min_slope: float = 0.0, warmup: int = 10):
  """The mean reward's least-squares slope over the last ``window`` steps is below
  ``min_slope`` (per step), once ``warmup`` steps have passed (derived: JF-HPO's "reward slope
  below 0 after warm-up")."""
  reward = _series(records, REWARD)
  if len(reward) < max(warmup, window, 2):
    return None
  s = slope(reward[-window:])
  return (
    f"reward falling (slope {s:.4f}/step < {min_slope:g} over the last {window} steps)"
    if s < min_slope
    else None
  )


def entropy_collapsed(records, *, floor: float = 0.05, warmup: int = 10):
  """The policy's token entropy of the last step is below ``floor`` after ``warmup`` steps."""
  entropy = _series(records, ENTROPY)
  if len(entropy) < max(warmup, 1) or entropy[-1] >= floor:
    return None
  return f"entropy collapsed ({entropy[-1]:.4f} < {floor:g})"


def length_blowup(records, *, factor: float = 3.0, first: int = 5):
  """The mean completion length of the last step is more than ``factor`` times its mean over the
  first ``first`` steps."""
  length = _series(records, LENGTH)
  if len(length) <= first:
    return None
  start = float(np.mean(length[:first]))
  if start > 0 and length[-1] > factor * start:
    return f"length blew up ({length[-1]:.1f} > {factor:g} x {start:.1f})"
  return None


def grad_spike(records, *, limit: float = 100.0):
  """Any step's gradient norm above ``limit``."""
  grad = _series(records, GRAD_NORM)
  if len(grad) and float(np.max(grad)) > limit:
    return f"gradient norm spiked ({float(np.max(grad)):.3g} > {limit:g})"
  return None


def kl_spike(records, *, limit: float = 1.0):
  """Any step's KL (the first of ``kl/mean``, ``loss/kl``, ``mismatch/k3`` the records carry)
  above ``limit``."""
  for key in KL_KEYS:
    kl = _series(records, key)
    if len(kl):
      return (
        f"KL spiked ({key} {float(np.max(kl)):.3g} > {limit:g})" if np.max(kl) > limit else None
      )
  return None


def nonfinite(records):
  """A step with a non-finite loss or gradient (``train/nonfinite`` > 0), or a non-finite reward."""
  bad = [r["step"] for r in records if float(r.get(NONFINITE, 0.0)) > 0]
  bad += [r["step"] for r in records if REWARD in r and not math.isfinite(float(r[REWARD]))]
  return f"non-finite step(s) {sorted(set(bad))[:5]}" if bad else None


RULES = {
  "reward_falling": reward_falling,
  "entropy_collapsed": entropy_collapsed,
  "length_blowup": length_blowup,
  "grad_spike": grad_spike,
  "kl_spike": kl_spike,
  "nonfinite": nonfinite,
}


def check(records: list[dict], rules: dict) -> str | None:
  """The first reason any rule of ``rules`` (name -> its keyword arguments) gives to stop,
  or None. An unknown rule or keyword is a ValueError naming the valid ones."""
  for name, kwargs in rules.items():
    if name not in RULES:
      raise ValueError(f"unknown early-stop rule {name!r}; valid rules: {', '.join(RULES)}")
    try:
      reason = RULES[name](records, **dict(kwargs or {}))
    except TypeError as e:
      raise ValueError(f"early-stop rule {name!r}: {e}") from None
    if reason:
      return f"{name}: {reason}"
  return None
