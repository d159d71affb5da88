"""The one rule that turns a reproduction's runs into its verdict.

A config declares its claim before the runs (``sweep.claim``): one part (``arm``, ``metric``,
``direction``, against ``sweep.baseline``) or several (``claim.parts``, each with its own
``arm``, ``versus``, ``metric``, ``direction`` and ``text``). Each part is tested on the seeds
both arms recorded: the paired t-test decides (two-sided, 5%), and the exact sign-flip test and
the count of seeds that went each way are shown beside it. A part is

- *supported*: the difference is in the declared direction, p < 0.05;
- *opposed*: the difference is against the declared direction, p < 0.05;
- *not significant*: otherwise, shown with the observed difference and the smallest difference
  the seeds could detect with 80% power;
- *not measured*: an arm is missing or no seed recorded the metric for both.

The claim's verdict: *reproduced* (every part supported), *partly reproduced* (some parts
supported), *contradicted* (no part supported, one opposed), *not significant* (no part
supported or opposed), *not measured* (no part measured). There is no "direction agrees".
"""

import math
from typing import NamedTuple

import numpy as np

from posttrain_jax.sweeps import stats

VERDICTS = ("reproduced", "partly reproduced", "not significant", "contradicted", "not measured")
ALPHA = 0.05


class Part(NamedTuple):
  """One declared part of a claim: ``arm`` is ``direction`` (higher / lower) than ``versus``
  on ``metric``."""

  text: str
  arm: str
  versus: str
  metric: str
  direction: str


class Result(NamedTuple):
  part: Part
  seeds: int
  diff: float  # mean of arm - versus
  half: float  # 95% CI half-width
  p: float  # paired t-test
  p_exact: float  # paired sign-flip test
  up: int  # seeds where arm > versus
  down: int
  detectable: float  # at 80% power
  status: str


def value(run: dict, metric: str) -> float:
  """``run[metric]`` as a float; NaN when the run did not record it."""
  v = run.get(metric)
  return math.nan if v is None else float(v)


def common_seeds(by_arm: dict, arms, metric: str) -> list:
  """The seeds every arm in ``arms`` ran and recorded a finite ``metric`` for."""
  seeds = set.intersection(*(set(by_arm.get(a, {})) for a in arms))
  return sorted(s for s in seeds if all(math.isfinite(value(by_arm[a][s], metric)) for a in arms))


def parts(claim, baseline: str) -> list[Part]:
  """The claim's declared parts (``claim.parts``), or its one part against ``baseline``."""
  declared = claim.get("parts", None)
  if not declared:  # its text is the claim's own line
    return [Part("", claim.arm, baseline, claim.metric, claim.direction)]
  return [
    Part(p.get("text", ""), p["arm"], p.get("versus", baseline), p["metric"], p["direction"])
    for p in declared
  ]


def test(part: Part, by_arm: dict) -> Result:
  """The part's paired tests over the seeds both arms recorded."""
  if part.direction not in ("higher", "lower"):
    raise ValueError(f"claim direction {part.direction!r}: use 'higher' or 'lower'")
  seeds = (
    common_seeds(by_arm, (part.arm, part.versus), part.metric)
    if (part.arm in by_arm and part.versus in by_arm)
    else []
  )
  a = np.array([value(by_arm[part.arm][s], part.metric) for s in seeds])
  b = np.array([value(by_arm[part.versus][s], part.metric) for s in seeds])
  if len(seeds) < 2:
    nan = math.nan
    return Result(part, len(seeds), nan, nan, nan, nan, 0, 0, nan, "not measured")
  diff, half, p = stats.paired_t_test(a, b)
  p_exact = stats.paired_sign_flip_p(a, b)
  sign = 1.0 if part.direction == "higher" else -1.0
  if p < ALPHA and sign * diff > 0:
    status = "supported"
  elif p < ALPHA and sign * diff < 0:
    status = "opposed"
  else:
    status = "not significant"
  up, down = int(np.sum(a > b)), int(np.sum(a < b))
  return Result(
    part, len(seeds), diff, half, p, p_exact, up, down, stats.detectable_effect(a, b), status
  )


def verdict(results: list[Result]) -> str:
  """The claim's verdict from its parts' results (module docstring)."""
  statuses = [r.status for r in results]
  if all(s == "not measured" for s in statuses):
    return "not measured"
  if all(s == "supported" for s in statuses):
    return "reproduced"
  if "supported" in statuses:
    return "partly reproduced"
  if "opposed" in statuses:
    return "contradicted"
  return "not significant"


def describe(r: Result) -> str:
  """One line for a part's result."""
  p = r.part
  head = f"{p.text + ' ' if p.text else ''}({p.arm} vs {p.versus} on {p.metric}, {p.direction})"
  if r.status == "not measured":
    return f"{head}: not measured ({r.seeds} seeds with both arms)."
  ties = r.seeds - r.up - r.down
  line = (
    f"{head}: {r.diff:+.4f} (95% CI ± {r.half:.4f}; paired t-test p = {r.p:.3g}, sign-flip "
    f"p = {r.p_exact:.3g}; {r.up} of {r.seeds} seeds higher, {r.down} lower, {ties} equal): "
    f"{r.status}"
  )
  if r.status == "not significant":
    line += f"; these {r.seeds} seeds detect a difference of {r.detectable:.4f} with 80% power"
  return line + "."


def judge(claim, by_arm: dict, baseline: str) -> tuple[str, str]:
  """(verdict, the text: the claim's line ending in the verdict, then one line per part)."""
  results = [test(p, by_arm) for p in parts(claim, baseline)]
  v = verdict(results)
  lines = [f"Claim: {claim.text} Verdict: {v}."]
  lines += [f"- {describe(r)}" for r in results]
  return v, "\n".join(lines)
