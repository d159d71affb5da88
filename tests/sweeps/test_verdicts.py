"""The verdict rule (sweeps/verdicts.py): reproduced, partly reproduced, not significant with the
detectable effect, contradicted; never "direction agrees"."""

import ml_collections
import numpy as np
import pytest

from posttrain_jax.sweeps import stats, verdicts


def _by_arm(**arms):
  """{arm: {seed: {"m": value}}} from lists of per-seed values."""
  return {a: {s: {"m": v} for s, v in enumerate(vals)} for a, vals in arms.items()}


def _claim(**kw):
  base = dict(text="x beats y.", arm="x", metric="m", direction="higher")
  return ml_collections.ConfigDict({**base, **kw})


BASE = [0.40, 0.50, 0.45, 0.52, 0.47]


def test_a_clear_gain_is_reproduced_and_the_exact_test_and_counts_are_shown():
  by_arm = _by_arm(x=[b + 0.1 + 0.01 * i for i, b in enumerate(BASE)], y=BASE)
  v, text = verdicts.judge(_claim(), by_arm, "y")
  assert v == "reproduced"
  assert text.startswith("Claim: x beats y. Verdict: reproduced.")
  assert "sign-flip p = 0.0625" in text and "5 of 5 seeds higher, 0 lower, 0 equal" in text


def test_a_tiny_positive_difference_is_not_significant_with_its_detectable_effect():
  noise = [0.05, -0.04, 0.03, -0.05, 0.0018]  # mean +0.0008 (the DenoiseRL case)
  by_arm = _by_arm(x=[b + n for b, n in zip(BASE, noise)], y=BASE)
  v, text = verdicts.judge(_claim(), by_arm, "y")
  assert v == "not significant"
  d = np.asarray(noise)
  want = stats.detectable_effect(d, np.zeros(5))
  assert f"these 5 seeds detect a difference of {want:.4f} with 80% power" in text
  assert "agrees" not in text


def test_a_significant_opposite_result_is_contradicted_without_a_null_sentence():
  by_arm = _by_arm(x=[b - 0.26 + 0.01 * i for i, b in enumerate(BASE)], y=BASE)
  v, text = verdicts.judge(_claim(), by_arm, "y")
  assert v == "contradicted" and ": opposed." in text
  assert "detect a difference" not in text


def test_a_lower_is_better_claim_and_multi_part_claims():
  by_arm = _by_arm(x=[b - 0.1 for b in BASE], y=BASE, z=[b - 0.2 for b in BASE])
  v, _ = verdicts.judge(_claim(direction="lower"), by_arm, "y")
  assert v == "reproduced"
  parts = [
    dict(text="x below y", arm="x", versus="y", metric="m", direction="lower"),
    dict(text="x below z", arm="x", versus="z", metric="m", direction="lower"),
  ]
  v, text = verdicts.judge(_claim(parts=parts), by_arm, "y")
  assert v == "partly reproduced"  # x is below y, but above z: that part is opposed
  assert "x below y (x vs y on m, lower)" in text and text.count("\n- ") == 2
  # a declared part that fails keeps the claim from "reproduced" even when the headline holds
  parts[1]["arm"], parts[1]["versus"] = "z", "y"
  assert verdicts.judge(_claim(parts=parts), by_arm, "y")[0] == "reproduced"


def test_missing_arms_and_too_few_seeds_are_not_measured():
  by_arm = _by_arm(x=[0.5], y=[0.4])
  assert verdicts.judge(_claim(), by_arm, "y")[0] == "not measured"
  assert verdicts.judge(_claim(), _by_arm(y=BASE), "y")[0] == "not measured"
  with pytest.raises(ValueError, match="use 'higher' or 'lower'"):
    verdicts.judge(_claim(direction="up"), _by_arm(x=BASE, y=BASE), "y")
