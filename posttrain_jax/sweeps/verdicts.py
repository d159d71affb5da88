"""The one rule that turns a reproduction's runs into its verdict.

A config declares its claim before the runs (``sweep.claim``): one part (``arm``, ``metric``,
``direction``, against ``sweep.baseline``) or several (``claim.parts``, each with its own
``arm``, ``versus`` (an arm) or ``value`` (a constant, e.g. chance), ``metric``, ``direction``
and ``text``). Two controls are added to every part that compares an arm with another arm:

- *its own start*: an ``X_after_rl`` metric is also tested against the same arm's
  ``X_before_rl`` (the checkpoint the arm started from), unless ``claim.start`` is False;
- *the strongest other arm*: the arm among ``claim.rivals`` (default: every other arm of the
  sweep) with the best mean on the part's metric, when it is better than the declared
  comparator; a claim that beats a weak baseline and loses to another arm is not reproduced.

A comparator that scored exactly 0 on every seed cannot lose: that part is reported as *void*
and does not count, and the claim rests on its controls (the gain over the method's start). A
comparator chosen after a pilot is named in ``claim.after_pilot`` and printed as such.

Each part is tested on the seeds both sides recorded: the paired t-test decides (two-sided, 5%),
and the exact sign-flip test and the count of seeds that went each way are shown beside it. A
part is

- *supported*: the difference is in the declared direction, p < 0.05;
- *opposed*: the difference is against the declared direction, p < 0.05;
- *not significant*: otherwise, shown with the observed difference and the smallest difference
  the seeds could detect with 80% power;
- *not measured*: an arm is missing or fewer than two seeds recorded the metric for both.

The claim's verdict comes from its declared parts (void ones left out; when all are void, from
the gain over the start): *reproduced* (every part supported), *partly reproduced* (some parts
supported), *contradicted* (no part supported, one opposed), *not significant* (no part
supported or opposed), *not measured* (no part measured). The controls can only lower it: a
*reproduced* claim whose control is not supported is *partly reproduced*. There is no
"direction agrees".
"""

import math
from typing import NamedTuple

import numpy as np

from posttrain_jax.sweeps import stats

VERDICTS = ("reproduced", "partly reproduced", "not significant", "contradicted", "not measured")
ALPHA = 0.05
AFTER, BEFORE = "_after_rl", "_before_rl"


class Part(NamedTuple):
  """One part of a claim: ``arm`` is ``direction`` (higher / lower) than ``versus`` (an arm)
  or, when ``versus`` is empty, than the constant ``value``, on ``metric``. ``control``: ''
  for a declared part, 'start' or 'strongest' for the controls the rule adds."""

  text: str
  arm: str
  versus: str
  metric: str
  direction: str
  value: float = math.nan
  control: str = ""


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


def start_of(arm: str) -> str:
  """The name of an arm's own start as a comparator (its ``*_before_rl`` values)."""
  return f"{arm} before RL"


def parts(claim, baseline: str) -> list[Part]:
  """The claim's declared parts (``claim.parts``), or its one part against ``baseline``."""
  declared = claim.get("parts", None)
  if not declared:  # its text is the claim's own line
    return [Part("", claim.arm, baseline, claim.metric, claim.direction)]
  out = []
  for p in declared:
    constant = p.get("value", None)
    versus = "" if constant is not None else p.get("versus", baseline)
    const = math.nan if constant is None else float(constant)
    out.append(Part(p.get("text", ""), p["arm"], versus, p["metric"], p["direction"], const))
  return out


def _mean(by_arm: dict, arm: str, metric: str, seeds) -> float:
  return float(np.mean([value(by_arm[arm][s], metric) for s in seeds]))


def controls(claim, declared: list[Part], by_arm: dict, arms) -> list[Part]:
  """The controls the rule adds to the declared parts (module docstring), each once."""
  out: list[Part] = []
  rivals = claim.get("rivals", None)
  rivals = tuple(arms) if rivals is None else tuple(rivals)
  for p in declared:
    if not p.versus:  # against a constant: nothing to add
      continue
    if claim.get("start", True) and p.metric.endswith(AFTER) and p.arm in by_arm:
      before = p.metric[: -len(AFTER)] + BEFORE
      if any(math.isfinite(value(r, before)) for r in by_arm[p.arm].values()):
        out.append(
          Part(
            "gain over its own start",
            p.arm,
            start_of(p.arm),
            p.metric,
            p.direction,
            control="start",
          )
        )
    sign = 1.0 if p.direction == "higher" else -1.0
    best, best_mean = p.versus, None
    for r in rivals:
      if r in (p.arm, p.versus) or r not in by_arm or p.versus not in by_arm:
        continue
      seeds = common_seeds(by_arm, (p.arm, p.versus, r), p.metric)
      if len(seeds) < 2:
        continue
      m = _mean(by_arm, r, p.metric, seeds)
      ref = _mean(by_arm, p.versus, p.metric, seeds) if best_mean is None else best_mean
      if sign * m > sign * ref:
        best, best_mean = r, m
    if best != p.versus:
      out.append(
        Part(
          "against the strongest other arm", p.arm, best, p.metric, p.direction, control="strongest"
        )
      )
  unique = []
  for c in out:
    if all((c.arm, c.versus, c.metric) != (q.arm, q.versus, q.metric) for q in declared + unique):
      unique.append(c)
  return unique


def with_starts(by_arm: dict, all_parts: list[Part]) -> dict:
  """``by_arm`` plus each start control's comparator: the arm's ``*_before_rl`` values under
  the ``*_after_rl`` metric's name."""
  out = dict(by_arm)
  for p in all_parts:
    if p.control == "start":
      before = p.metric[: -len(AFTER)] + BEFORE
      made = out.get(p.versus, {})  # an arm's starts on several metrics share one comparator
      out[p.versus] = {
        s: {**made.get(s, r), p.metric: r.get(before)} for s, r in by_arm[p.arm].items()
      }
  return out


def test(part: Part, by_arm: dict) -> Result:
  """The part's paired tests over the seeds both sides recorded."""
  if part.direction not in ("higher", "lower"):
    raise ValueError(f"claim direction {part.direction!r}: use 'higher' or 'lower'")
  if not part.versus:  # a constant comparator: a one-sample test of arm - value
    seeds = common_seeds(by_arm, (part.arm,), part.metric) if part.arm in by_arm else []
    b = np.full(len(seeds), part.value)
  else:
    both = part.arm in by_arm and part.versus in by_arm
    seeds = common_seeds(by_arm, (part.arm, part.versus), part.metric) if both else []
    b = np.array([value(by_arm[part.versus][s], part.metric) for s in seeds])
  a = np.array([value(by_arm[part.arm][s], part.metric) for s in seeds])
  if len(seeds) < 2:
    nan = math.nan
    return Result(part, len(seeds), nan, nan, nan, nan, 0, 0, nan, "not measured")
  diff, half, p = stats.paired_t_test(a, b)
  p_exact = stats.paired_sign_flip_p(a, b)
  sign = 1.0 if part.direction == "higher" else -1.0
  if part.versus and part.direction == "higher" and not part.control and np.all(b == 0):
    status = "void"
  elif p < ALPHA and sign * diff > 0:
    status = "supported"
  elif p < ALPHA and sign * diff < 0:
    status = "opposed"
  else:
    status = "not significant"
  up, down = int(np.sum(a > b)), int(np.sum(a < b))
  return Result(
    part, len(seeds), diff, half, p, p_exact, up, down, stats.detectable_effect(a, b), status
  )


def _rule(statuses: list[str]) -> str:
  if all(s == "not measured" for s in statuses):
    return "not measured"
  if all(s == "supported" for s in statuses):
    return "reproduced"
  if "supported" in statuses:
    return "partly reproduced"
  if "opposed" in statuses:
    return "contradicted"
  return "not significant"


def verdict(results: list[Result]) -> str:
  """The claim's verdict from its parts' results (module docstring). The declared parts decide
  (void ones left out; when every declared part is void, the gain over the start decides); a
  control that is not supported turns *reproduced* into *partly reproduced*, and never lifts a
  verdict."""
  declared = [r.status for r in results if not r.part.control and r.status != "void"]
  starts = [r.status for r in results if r.part.control == "start"]
  if not declared and any(r.status == "void" for r in results):
    declared = starts
  v = _rule(declared) if declared else "not measured"
  checks = [r.status for r in results if r.part.control]
  if v == "reproduced" and any(s != "supported" for s in checks):
    return "partly reproduced"
  return v


def describe(r: Result) -> str:
  """One line for a part's result."""
  p = r.part
  versus = p.versus or f"{p.value:g}"
  head = f"{p.text + ' ' if p.text else ''}({p.arm} vs {versus} on {p.metric}, {p.direction})"
  if r.status == "not measured":
    return f"{head}: not measured ({r.seeds} seeds with both sides)."
  ties = r.seeds - r.up - r.down
  line = (
    f"{head}: {r.diff:+.4f} (95% CI ± {r.half:.4f}; paired t-test p = {r.p:.3g}, sign-flip "
    f"p = {r.p_exact:.3g}; {r.up} of {r.seeds} seeds higher, {r.down} lower, {ties} equal): "
    f"{r.status}"
  )
  if r.status == "void":
    line += (
      f" ({p.versus} scored 0 on every seed and cannot lose, so the gap to it is no evidence; "
      "the claim rests on the gain over the method's own start)"
    )
  elif r.status == "not significant":
    line += f"; these {r.seeds} seeds detect a difference of {r.detectable:.4f} with 80% power"
  return line + "."


def engagement(check, by_arm: dict) -> tuple[int, int]:
  """``(engaged, seeds)``: of the seeds where ``check.arm`` recorded ``check.metric``, those
  where the mechanism engaged, declared before the runs (``sweep.engaged``): the metric above
  the number ``check.above``, or above the same run's ``check.versus_metric``."""
  engaged = seeds = 0
  for run in by_arm.get(check.arm, {}).values():
    v = value(run, check.metric)
    bar = value(run, check.versus_metric) if "versus_metric" in check else float(check.above)
    if math.isfinite(v) and math.isfinite(bar):
      seeds += 1
      engaged += v > bar
  return engaged, seeds


def by_arm_of(records) -> dict:
  """{arm: {seed: run}} from a table's runs (runs.jsonl records)."""
  out: dict = {}
  for r in records:
    out.setdefault(r["arm"], {})[r["seed"]] = r
  return out


def results_of(claim, by_arm: dict, baseline: str, arms=None) -> list[Result]:
  """Every declared part and its controls, tested. ``arms``: the sweep's arms, the default
  rivals (every arm that recorded runs when None)."""
  declared = parts(claim, baseline)
  added = controls(claim, declared, by_arm, by_arm if arms is None else arms)
  everything = declared + added
  data = with_starts(by_arm, everything)
  return [test(p, data) for p in everything]


def judge(claim, by_arm: dict, baseline: str, arms=None) -> tuple[str, str]:
  """(verdict, the text: the claim's line ending in the verdict, then one line per part)."""
  results = results_of(claim, by_arm, baseline, arms)
  v = verdict(results)
  lines = [f"Claim: {claim.text} Verdict: {v}."]
  lines += [f"- {describe(r)}" for r in results]
  pilot = tuple(claim.get("after_pilot", ()))
  if pilot:
    lines.append(f"- Comparator(s) chosen after a pilot, not before the runs: {', '.join(pilot)}.")
  return v, "\n".join(lines)
