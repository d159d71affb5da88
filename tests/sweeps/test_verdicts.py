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
  v, _ = verdicts.judge(_claim(direction="lower"), by_arm, "y", arms=("x", "y"))
  assert v == "reproduced"
  # z is lower still: the strongest other arm keeps the claim from "reproduced"
  assert verdicts.judge(_claim(direction="lower"), by_arm, "y")[0] == "partly reproduced"
  parts = [
    dict(text="x below y", arm="x", versus="y", metric="m", direction="lower"),
    dict(text="x below z", arm="x", versus="z", metric="m", direction="lower"),
  ]
  v, text = verdicts.judge(_claim(parts=parts, rivals=()), by_arm, "y")
  assert v == "partly reproduced"  # x is below y, but above z: that part is opposed
  assert "x below y (x vs y on m, lower)" in text and text.count("\n- ") == 2
  # a declared part that fails keeps the claim from "reproduced" even when the headline holds
  parts[1]["arm"], parts[1]["versus"] = "z", "y"
  assert verdicts.judge(_claim(parts=parts, rivals=()), by_arm, "y")[0] == "reproduced"


def test_missing_arms_and_too_few_seeds_are_not_measured():
  by_arm = _by_arm(x=[0.5], y=[0.4])
  assert verdicts.judge(_claim(), by_arm, "y")[0] == "not measured"
  assert verdicts.judge(_claim(), _by_arm(y=BASE), "y")[0] == "not measured"
  with pytest.raises(ValueError, match="use 'higher' or 'lower'"):
    verdicts.judge(_claim(direction="up"), _by_arm(x=BASE, y=BASE), "y")


def _runs(after, before):
  """{seed: {"m_after_rl": a, "m_before_rl": b}} for an arm."""
  return {s: {"m_after_rl": a, "m_before_rl": b} for s, (a, b) in enumerate(zip(after, before))}


def _claim_after(**kw):
  return _claim(metric="m_after_rl", **kw)


def test_a_comparator_that_cannot_score_is_void_and_the_gain_over_the_start_decides():
  start = [0.30, 0.35, 0.32, 0.40, 0.31]
  by_arm = {"x": _runs([s + 0.005 * (i % 2) for i, s in enumerate(start)], start)}
  by_arm["y"] = _runs([0.0] * 5, [0.0] * 5)  # the tool-use case: the baseline scores 0
  v, text = verdicts.judge(_claim_after(), by_arm, "y")
  assert ": void (y scored 0 on every seed" in text
  assert "gain over its own start (x vs x before RL on m_after_rl, higher)" in text
  assert v == "not significant"  # x barely moved from its start: the zero proves nothing
  by_arm["x"] = _runs([s + 0.15 + 0.01 * i for i, s in enumerate(start)], start)
  assert verdicts.judge(_claim_after(), by_arm, "y")[0] == "reproduced"


def test_beating_the_baseline_but_not_the_start_or_the_strongest_arm_is_partly_reproduced():
  start = [0.50, 0.55, 0.52, 0.58, 0.51]
  weak = [s - 0.2 for s in start]  # a baseline that collapsed below the shared start
  by_arm = {
    "x": _runs([s + 0.01 * (-1) ** i for i, s in enumerate(start)], start),
    "y": _runs(weak, start),
  }
  v, text = verdicts.judge(_claim_after(), by_arm, "y")
  assert "(x vs y on m_after_rl, higher)" in text and ": supported." in text
  assert v == "partly reproduced"  # x never left its start (the CGTR case)
  # a clear gain over the start, but a third arm is better still: the strongest arm is tested
  by_arm["x"] = _runs([s + 0.2 + 0.01 * i for i, s in enumerate(start)], start)
  by_arm["z"] = _runs([s + 0.3 + 0.01 * i for i, s in enumerate(start)], start)
  v, text = verdicts.judge(_claim_after(), by_arm, "y", arms=("x", "y", "z"))
  assert "against the strongest other arm (x vs z on m_after_rl, higher)" in text
  assert v == "partly reproduced"
  # declared rivals leave z out (e.g. an ablation at another staleness); no start control
  claim = _claim_after(rivals=(), start=False)
  v, text = verdicts.judge(claim, by_arm, "y", arms=("x", "y", "z"))
  assert v == "reproduced" and "strongest" not in text and "own start" not in text
  # the controls never lift a verdict: a failed headline stays failed with a good start gain
  by_arm["y"] = _runs([a + 0.3 for a in start], start)
  assert verdicts.judge(_claim_after(), by_arm, "y", arms=("x", "y"))[0] == "contradicted"


def test_a_part_against_a_constant_and_a_comparator_chosen_after_a_pilot():
  by_arm = _by_arm(x=[0.80, 0.82, 0.85, 0.79, 0.81], c=[0.34, 0.35, 0.33, 0.36, 0.35])
  parts = [
    dict(text="x high", arm="x", versus="c", metric="m", direction="higher"),
    dict(text="c near chance", arm="c", value=0.30, metric="m", direction="lower"),
  ]
  v, text = verdicts.judge(_claim(parts=parts, after_pilot=("c",)), by_arm, "c")
  assert "c near chance (c vs 0.3 on m, lower)" in text and ": opposed." in text
  assert v == "partly reproduced"  # the ToM audit's case: its second half fails
  assert text.endswith("Comparator(s) chosen after a pilot, not before the runs: c.")
  diff, _, p = stats.paired_t_test([0.34, 0.35, 0.33, 0.36, 0.35], [0.3] * 5)
  assert f"{diff:+.4f}" in text and f"p = {p:.3g}" in text


def test_one_arm_started_on_two_metrics_is_tested_on_each_metrics_own_start():
  """Two declared parts of one arm on two ``*_after_rl`` metrics: each start control compares
  that metric's after and before values (the second must not overwrite the first)."""
  start_a, start_b = [0.20, 0.22, 0.25, 0.21, 0.23], [0.10, 0.12, 0.09, 0.11, 0.10]
  x = {
    s: {"a_after_rl": a + 0.1 + 0.01 * s, "a_before_rl": a, "b_after_rl": b, "b_before_rl": b}
    for s, (a, b) in enumerate(zip(start_a, start_b))
  }
  y = {s: {"a_after_rl": a, "b_after_rl": b} for s, (a, b) in enumerate(zip(start_a, start_b))}
  parts = [
    dict(text="a", arm="x", versus="y", metric="a_after_rl", direction="higher"),
    dict(text="b", arm="x", versus="y", metric="b_after_rl", direction="higher"),
  ]
  _, text = verdicts.judge(_claim(parts=parts), {"x": x, "y": y}, "y")
  line = [t for t in text.splitlines() if "x before RL on a_after_rl" in t][0]
  assert "5 of 5 seeds higher" in line and ": supported." in line
  line = [t for t in text.splitlines() if "x before RL on b_after_rl" in t][0]
  assert "0 of 5 seeds higher, 0 lower, 5 equal" in line
