"""``scripts/reproduce.py CONFIG --check [--seeds K]``: rerun K of a table's recorded seeds here
and say how far the rerun lands from the record, and whether the verdict survives.

The rerun goes to ``results/NAME/check/`` (its runs are not committed); the comparison to
``results/NAME/rerun.json`` and ``rerun.md`` (committed: the last check). For every arm, seed
and metric of the table (its columns and the metrics its claim tests): the recorded value,
the rerun's and their difference. Then the verdict is recomputed by the same rule
(sweeps/verdicts.py) with the rerun's runs in place of the recorded runs of those seeds: a
verdict that changes is not robust to the spread a rerun produces, and the table says so
(:func:`table_line`, printed under the verdict). The sweep's ``clock_metrics`` (timings, and
what a budget of CPU seconds decided) differ on every rerun whatever the settings: their change
is reported beside the others', never as the table's largest, and a rerun that differs on them
alone reads "identical but for its clock metrics".
"""

import json
import math
import os
import shutil

from posttrain_jax import io as ptio
from posttrain_jax.sweeps import environment, verdicts

JSON, MD = "rerun.json", "rerun.md"


def claim_metrics(sweep) -> list[str]:
  """The metrics the claim's parts test (the claim's own when it declares no parts)."""
  claim = sweep.claim
  parts = [p.get("metric", "") for p in claim.get("parts", ())] or [claim.get("metric", "")]
  return [m for m in dict.fromkeys(parts) if m]


def clock_metrics(sweep) -> list[str]:
  """The metrics the sweep declares as measured on (or decided by) the clock."""
  return list(sweep.get("clock_metrics", ()))


def metrics_of(sweep) -> list[str]:
  """The table's columns, then any other metric its claim or mechanism check reads."""
  out = list(sweep.metrics)
  claim = sweep.claim
  extra = [claim.get("metric", "")] + [p.get("metric", "") for p in claim.get("parts", ())]
  engaged = sweep.get("engaged", None)
  if engaged is not None:
    extra += [engaged.metric, engaged.get("versus_metric", "")]
  return out + [m for m in dict.fromkeys(extra) if m and m not in out]


def _value(run: dict | None, metric: str) -> float:
  return verdicts.value(run, metric) if run is not None else math.nan


def compare(recorded: list[dict], rerun: list[dict], metrics, seeds) -> list[dict]:
  """One row per (arm, seed, metric) the rerun ran: recorded, rerun, rerun - recorded (NaN
  where either side lacks the metric)."""
  old, new = verdicts.by_arm_of(recorded), verdicts.by_arm_of(rerun)
  rows = []
  for arm in sorted(new, key=list(new).index):
    for seed in seeds:
      for m in metrics:
        a = _value(old.get(arm, {}).get(seed), m)
        b = _value(new[arm].get(seed), m)
        if math.isnan(a) and math.isnan(b):
          continue
        rows.append(
          {"arm": arm, "seed": seed, "metric": m, "recorded": a, "rerun": b, "diff": b - a}
        )
  return rows


def swapped(recorded: list[dict], rerun: list[dict]) -> list[dict]:
  """The table's runs with the rerun's runs in place of the recorded runs of the same arm and
  seed."""
  redone = {(r["arm"], r["seed"]) for r in rerun}
  return [r for r in recorded if (r["arm"], r["seed"]) not in redone] + list(rerun)


def verdict_change(sweep, recorded: list[dict], rerun: list[dict]) -> dict:
  """The verdict and each part's status, from the recorded runs and with the rerun swapped
  in."""
  claim, baseline, arms = sweep.claim, sweep.baseline, sweep.arms
  before = verdicts.results_of(claim, verdicts.by_arm_of(recorded), baseline, arms)
  after = verdicts.results_of(claim, verdicts.by_arm_of(swapped(recorded, rerun)), baseline, arms)
  v0, v1 = verdicts.verdict(before), verdicts.verdict(after)
  parts = [
    {
      "text": a.part.text or f"{a.part.arm} vs {a.part.versus or a.part.value} on {a.part.metric}",
      "control": a.part.control,
      "before": a.status,
      "after": b.status,
    }
    for a, b in zip(before, after)
  ]
  return {"before": v0, "after": v1, "changed": v0 != v1, "parts": parts}


def seed_sd(recorded: list[dict], arm: str, metric: str) -> float:
  """The standard deviation (n - 1) of ``metric`` over the table's recorded seeds of ``arm``:
  the scale a rerun's change is read on. NaN with fewer than two finite values."""
  values = [_value(r, metric) for r in verdicts.by_arm_of(recorded).get(arm, {}).values()]
  values = [v for v in values if math.isfinite(v)]
  if len(values) < 2:
    return math.nan
  mean = sum(values) / len(values)
  return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def spread(rows: list[dict], recorded: list[dict] | None = None) -> dict:
  """Per metric, the largest |rerun - recorded|, the arm and seed it came from and, given the
  table's ``recorded`` runs, that arm's between-seed standard deviation of the metric
  (``seed_sd``) and the change in units of it (``relative``; NaN where the SD is 0 or
  unknown), which compares metrics of different scales."""
  out = {}
  for r in rows:
    d = abs(r["diff"])
    if math.isfinite(d) and d >= out.get(r["metric"], {}).get("max_abs_diff", -1.0):
      out[r["metric"]] = {"max_abs_diff": d, "arm": r["arm"], "seed": r["seed"]}
  if recorded is not None:
    for metric, entry in out.items():
      sd = seed_sd(recorded, entry["arm"], metric)
      entry["seed_sd"] = sd
      entry["relative"] = entry["max_abs_diff"] / sd if sd > 0 else math.nan
  return out


def summarise(sweep, recorded, rerun, seeds, env: dict) -> dict:
  """rerun.json's content."""
  rows = compare(recorded, rerun, metrics_of(sweep), seeds)
  finite = [r for r in rows if math.isfinite(r["diff"])]
  recorded_env = env.get("recorded_environment", {})
  return {
    "seeds": list(seeds),
    "arms_rerun": sorted({r["arm"] for r in rerun}),
    "identical": bool(finite) and all(r["diff"] == 0 for r in finite) and len(finite) == len(rows),
    "spread": spread(rows, recorded),
    "claim_metrics": claim_metrics(sweep),
    "clock_metrics": clock_metrics(sweep),
    "verdict": verdict_change(sweep, recorded, rerun),
    "environment": env.get("rerun_environment", {}),
    "recorded_environment": recorded_env,
    "rows": rows,
  }


def _num(x: float) -> str:
  return "n/a" if not math.isfinite(x) else f"{x:.4g}"


def markdown(title: str, result: dict, command: str) -> str:
  """rerun.md: the check's environment beside the record's, the verdict, then every row."""
  v = result["verdict"]
  clock = result.get("clock_metrics") or ()
  lines = [
    f"# Rerun check: {title}",
    "",
    f"Seeds rerun: {', '.join(map(str, result['seeds']))}. {table_line(result)}",
    "",
    f"- Recorded runs: {environment.describe(result['recorded_environment'])}.",
    f"- This rerun: {environment.describe(result['environment'])}.",
    *(
      [f"- Clock metrics (timed, or decided by a budget of CPU seconds): {', '.join(clock)}."]
      if clock
      else []
    ),
    "",
    f"Verdict from the recorded runs: {v['before']}; with the rerun swapped in: {v['after']}.",
    "",
  ]
  changed = [p for p in v["parts"] if p["before"] != p["after"]]
  lines += [
    f"- Part {p['text']!r}{' (control: ' + p['control'] + ')' if p['control'] else ''}: "
    f"{p['before']} -> {p['after']}."
    for p in changed
  ] or ["- No part's status changed."]
  header = ["arm", "seed", "metric", "recorded", "rerun", "rerun - recorded"]
  rows = [
    [r["arm"], r["seed"], r["metric"], _num(r["recorded"]), _num(r["rerun"]), _num(r["diff"])]
    for r in result["rows"]
  ]
  lines += ["", ptio.format_table(header, rows), "", f"Command: `{command}`", ""]
  return "\n".join(lines)


def largest(result: dict, *, clock: bool = False):
  """((metric, its spread entry) with the largest change, whether it is among the metrics the
  claim tests): the claim's metrics are preferred; any metric when none of them was recorded.
  Among the sweep's clock metrics when ``clock``, else among the others. The largest relative
  to each metric's between-seed SD where that is known (a check written before it was
  recorded: the largest absolute change). ``(None, False)`` when nothing was compared."""
  on_clock = set(result.get("clock_metrics", ()))
  pool = {m: v for m, v in result["spread"].items() if (m in on_clock) == clock}
  tested = {m: v for m, v in pool.items() if m in result.get("claim_metrics", ())}
  pool = tested or pool
  scaled = {m: v for m, v in pool.items() if math.isfinite(v.get("relative", math.nan))}
  if scaled:  # in units of each metric's between-seed SD: scales are comparable
    return max(scaled.items(), key=lambda kv: kv[1]["relative"]), bool(tested)
  top = max(pool.items(), key=lambda kv: kv[1]["max_abs_diff"], default=None)
  return top, bool(tested)


def identical_off_clock(result: dict) -> bool:
  """Whether every compared value other than the clock metrics' is the same in the rerun."""
  on_clock = set(result.get("clock_metrics", ()))
  rows = [r for r in result["rows"] if r["metric"] not in on_clock]
  return bool(rows) and all(r["diff"] == 0 for r in rows)


def _change(top, tested: bool) -> str:
  """'[on the claim's metrics ]X in M (arm; r x its between-seed SD)', '' without a change."""
  if not top or top[1]["max_abs_diff"] == 0:
    return ""
  rel = top[1].get("relative", math.nan)
  scale = f"; {rel:.2g} x its between-seed SD" if math.isfinite(rel) else ""
  claim = "on the claim's metrics " if tested else ""
  return f"{claim}{top[1]['max_abs_diff']:.4g} in {top[0]} ({top[1]['arm']}{scale})"


def table_line(result: dict) -> str:
  """The sentence a table prints under its verdict about its last rerun check."""
  seeds = ", ".join(map(str, result["seeds"]))
  cpu = result["environment"].get("cpu", {}).get("model", "another machine")
  v = result["verdict"]
  head = f"Rerun check (seed {seeds} on {cpu}, rerun.md): "
  clock = _change(*largest(result, clock=True))
  if result["identical"]:
    head += "identical to the recorded runs"
  elif identical_off_clock(result):
    head += "identical but for its clock metrics, which no setting fixes"
    head += f": the largest change {clock}" if clock else ""
  else:
    other = _change(*largest(result))
    head += "the rerun differs" + (f"; the largest change {other}" if other else "")
    head += f"; on the clock, the largest change {clock}" if clock else ""
  tail = (
    f"with the rerun swapped in, the verdict stays {v['after']}"
    if not v["changed"]
    else f"with the rerun swapped in, the verdict would be {v['after']}, not {v['before']}: "
    "it is not robust to this spread"
  )
  return f"{head}; {tail}."


def read(out_dir: str) -> dict | None:
  path = os.path.join(out_dir, JSON)
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def discard(out_dir: str) -> None:
  """Removes the table's last check (rerun.json, rerun.md) and the runs it made (check/)."""
  for name in (JSON, MD):
    path = os.path.join(out_dir, name)
    if os.path.exists(path):
      os.remove(path)
  shutil.rmtree(os.path.join(out_dir, "check"), ignore_errors=True)


def write(out_dir: str, title: str, result: dict, command: str) -> str:
  with open(os.path.join(out_dir, JSON), "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1, sort_keys=True, allow_nan=True)
    f.write("\n")
  text = markdown(title, result, command)
  with open(os.path.join(out_dir, MD), "w", encoding="utf-8") as f:
    f.write(text)
  return text


def last_environment(out_dir: str) -> dict:
  """The last environment record of the table's runs (a legacy one when none was kept)."""
  path = os.path.join(out_dir, environment.FILE)
  records = ptio.read_jsonl(path) if os.path.exists(path) else []
  return records[-1] if records else environment.legacy_record(out_dir)
