"""Turns the runs of a reproduction into ``results/NAME/``: table, runs.jsonl, curves, claim."""

import json
import math
import os

import numpy as np

from posttrain_jax import io as ptio
from posttrain_jax.sweeps import rerun_check, stats, verdicts


def _fmt(mean: float, half: float) -> str:
  if math.isnan(mean):
    return "n/a"
  return f"{mean:.3f}" + ("" if math.isnan(half) else f" ± {half:.3f}")


def claim_verdict(claim, by_arm: dict, baseline: str, arms=None) -> str:
  """The claim's verdict and its parts' tests (sweeps/verdicts.py, the one rule)."""
  return verdicts.judge(claim, by_arm, baseline, arms)[1]


def gate_line(gate, bases: list[dict]) -> str:
  """The base-health gate's sentence for the table: what was declared, and which seeds' shared
  starts fell below the floor and were replaced."""
  if gate is None:
    return "Base-health gate: none declared (a dead shared start is not replaced)."
  low = [b for b in bases if not b["healthy"]]
  after = any(b.get("source") == "runs" for b in bases)
  head = (
    f"Base-health gate ({'declared after the runs, checked on their recorded starts' if after else 'declared before the runs'}): "
    f"a seed's shared start needs {gate.metric} >= {gate.floor}"
  )
  if not bases:
    return head + "; no seed was checked."
  failed = [f"seed {b['seed']}" for b in low if not math.isfinite(b["value"])]
  low = [b for b in low if math.isfinite(b["value"])]
  replaced = [f"seed {b['seed']} ({b['value']:.3f})" for b in low if not b.get("used")]
  kept = [f"seed {b['seed']} ({b['value']:.3f})" for b in low if b.get("used")]
  line = head + f"; {len(bases)} seeds checked, {len(low)} below the floor"
  if replaced:
    line += f", replaced by the next unused seed: {', '.join(replaced)}"
  if kept:
    why = "a rerun would replace them" if after else "a smoke run replaces nothing"
    line += f", kept ({why}): {', '.join(kept)}"
  if failed:
    line += f"; the base of {', '.join(failed)} failed and is left out"
  return line + "."


def engagement_line(check, by_arm: dict) -> tuple[str, str]:
  """The declared mechanism check's sentence for the table, and a sentence added to the verdict
  when the mechanism engaged in fewer than half the seeds (the verdict then says little about
  the method); ``("", "")`` when none was declared."""
  if check is None:
    return "", ""
  engaged, seeds = verdicts.engagement(check, by_arm)
  bar = check.versus_metric if "versus_metric" in check else f"{check.above:g}"
  line = (
    f"Mechanism check (declared {'after' if check.get('after_runs', False) else 'before'} "
    f"the runs): {check.text}: {check.arm}'s "
    f"{check.metric} > {bar} in {engaged} of {seeds} seeds."
  )
  if seeds and 2 * engaged >= seeds:
    return line, ""
  return line, (
    f"The mechanism engaged in {engaged} of {seeds} seeds, so this verdict says little about "
    "the method itself."
  )


MECHANISM = "Why this setting exposes the mechanism:"
# The form issue 38's reruns state it in: what the mechanism needs, then how the setting gives it.
NEEDS = "What the mechanism needs, and how this setting provides it:"


CHANGED = "Changed for the rerun"
CHANGED_AFTER = "Changed after the runs"


def paragraph(doc: str | None, lead: str) -> str:
  """The paragraph of a config's docstring from ``lead`` to its end, unwrapped ('' when the
  docstring has none)."""
  for block in (doc or "").split("\n\n"):
    flat = " ".join(block.split())
    if lead in flat:
      return flat[flat.index(lead) :]
  return ""


def changes(doc: str | None) -> str:
  """What a config says changed after results were seen (a pilot, an earlier table, the runs):
  its 'Changed for the rerun' and 'Changed after the runs' paragraphs, printed in the table."""
  return " ".join(p for p in (paragraph(doc, CHANGED), paragraph(doc, CHANGED_AFTER)) if p)


def mechanism(doc: str | None) -> str:
  """The sentence(s) of an experiment config's docstring that say why its setting exposes the
  paper's mechanism: from ``MECHANISM`` and from ``NEEDS`` to the end of each paragraph,
  unwrapped and joined ('' when the docstring has neither)."""
  return " ".join(p for p in (paragraph(doc, MECHANISM), paragraph(doc, NEEDS)) if p)


HISTORY, HISTORY_TITLE = "history.md", "# Earlier versions of table.md"


def archive(out_dir: str, reason: str, *, when: str, commit: str) -> None:
  """Moves the table about to be replaced into ``out_dir/history.md`` (newest first), headed
  by the date and commit of its replacement and what changed and why (``reason``: the config's
  'Changed for the rerun' paragraph)."""
  with open(os.path.join(out_dir, "table.md"), encoding="utf-8") as f:
    old = f.read().strip()
  path = os.path.join(out_dir, HISTORY)
  earlier = ""
  if os.path.exists(path):  # the entries below the file's title
    with open(path, encoding="utf-8") as f:
      earlier = f.read().removeprefix(HISTORY_TITLE).strip()
  body = "\n".join(("#" + line) if line.startswith("#") else line for line in old.splitlines())
  entry = (
    f"## Replaced on {when} (at commit {commit})\n\n"
    f"{reason or 'What changed was not stated in the config.'}\n\n{body}\n"
  )
  with open(path, "w", encoding="utf-8") as f:
    f.write(f"{HISTORY_TITLE}\n\n{entry}\n{earlier}".rstrip() + "\n")


def write_report(
  out_dir: str,
  sweep,
  records: list[dict],
  command: str,
  *,
  setting: str = "",
  curves: bool = True,
  bases: list[dict] = (),
  changed: str = "",
) -> str:
  """Writes table.md, runs.jsonl, curves PNGs (unless not ``curves``) and command.txt; returns
  the table text. ``setting``: why the toy setting exposes the mechanism (:func:`mechanism`),
  printed under the verdict; ``bases``: the base-health gate's records (reproduce.py);
  ``changed``: what the config says changed after results were seen (:func:`changes`)."""
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "runs.jsonl"), "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(r, sort_keys=True) + "\n")
  by_arm = verdicts.by_arm_of(records)
  metrics, baseline = list(sweep.metrics), sweep.baseline
  header = (
    ["arm", "seeds"]
    + [f"{m} (mean ± 95% CI)" for m in metrics]
    + [f"Δ {m} vs {baseline} (p)" for m in metrics]
  )
  rows = []
  for arm in sweep.arms:
    runs = by_arm.get(arm, {})
    row = [arm, len(runs)]
    for m in metrics:
      values = [v for v in (verdicts.value(r, m) for r in runs.values()) if math.isfinite(v)]
      cell = _fmt(*stats.mean_ci(values))
      if 0 < len(values) < len(runs):  # some runs did not record it
        cell += f" ({len(values)} of {len(runs)} seeds)"
      row.append(cell)
    for m in metrics:
      common = verdicts.common_seeds(by_arm, (arm, baseline), m)
      if arm == baseline or not common:
        row.append("—")
        continue
      diff, _, p = stats.paired_t_test(
        [verdicts.value(runs[s], m) for s in common],
        [verdicts.value(by_arm[baseline][s], m) for s in common],
      )
      row.append(f"{diff:+.3f} (p={p:.2g})")
    rows.append(row)
  verdict = claim_verdict(sweep.claim, by_arm, baseline, sweep.arms)
  engaged, caveat = engagement_line(sweep.get("engaged", None), by_arm)
  for line in (rerun_line(out_dir), caveat):  # right under the verdict's line
    if line:
      head, _, rest = verdict.partition("\n")
      verdict = f"{head}\n{line}" + (f"\n{rest}" if rest else "")
  notes = list(sweep.get("notes", ()))
  text = "\n".join(
    [
      f"# {sweep.title}",
      "",
      verdict,
      "",
      *([setting, ""] if setting else []),
      *([changed, ""] if changed else []),
      *([engaged, ""] if engaged else []),
      gate_line(sweep.get("base_health", None), list(bases))
      if tuple(sweep.get("shared_stages", ()))
      else "Base-health gate: not applicable (the arms share no stage).",
      "",
      ptio.format_table(header, rows),
      "",
      *(f"- {n}" for n in notes),
      "",
      f"Command: `{command}`",
      "",
    ]
  )
  with open(os.path.join(out_dir, "table.md"), "w", encoding="utf-8") as f:
    f.write(text)
  with open(os.path.join(out_dir, "command.txt"), "w", encoding="utf-8") as f:
    f.write(command + "\n")
  if curves:
    _curves(out_dir, sweep, records)
  return text


def rerun_line(out_dir: str) -> str:
  """What the table's last rerun check found (rerun.json), or that none was made."""
  result = rerun_check.read(out_dir)
  if result is None:
    return "Rerun check: none yet (`python scripts/reproduce.py CONFIG --check`)."
  return rerun_check.table_line(result)


def _curves(out_dir: str, sweep, records: list[dict]) -> None:
  """Per curve key, the mean over seeds of each arm's RL metric against step."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  keys = list(sweep.get("curves", ("reward/mean", "eval/accuracy")))
  if not keys:  # the sweep asked for no curves
    return
  fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.6), squeeze=False)
  for ax, key in zip(axes[0], keys):
    for arm in sweep.arms:
      series: dict[int, list] = {}
      for r in records:
        if r["arm"] != arm:
          continue
        for rec in ptio.read_jsonl(os.path.join(r["workdir"], "rl", "metrics.jsonl")):
          if isinstance(rec.get(key), (int, float)):
            series.setdefault(rec["step"], []).append(rec[key])
      if series:
        steps = sorted(series)
        ax.plot(steps, [np.mean(series[s]) for s in steps], label=arm)
    ax.set_title(key + " (mean over seeds)")
    ax.set_xlabel("rl step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "curves.png"), dpi=110)
  plt.close(fig)
