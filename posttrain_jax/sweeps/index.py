"""The results index: every table under ``results/`` recomputed from the files committed beside
it, and the results tables of README.md and docs/experiments.md generated from those files, so
no number about a result is typed anywhere (``python scripts/gen_results.py [--check]``)."""

import glob
import math
import os
import shutil
import tempfile

from posttrain_jax import io as ptio
from posttrain_jax.sweeps import report, rerun_check, verdicts
from posttrain_jax.sweeps.reproduce import BASES, load_config_module, rewrite_report, sweep_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
EXPERIMENTS = os.path.join(ROOT, "docs", "experiments.md")
START, END = "<!-- results index: start (scripts/gen_results.py) -->", "<!-- results index: end -->"
OUT_OF_DATE = "{} is out of date; run python scripts/gen_results.py"
# Files a table folder holds besides its extra reports (linked from the docs' row).
CORE = {"table.md", "runs.jsonl", "command.txt", "bases.jsonl", "curves.png", "history.md"}


def names(root: str = ROOT) -> list[str]:
  """The tables under ``results/`` (a folder with table.md and its experiments/ config)."""
  return sorted(
    os.path.basename(os.path.dirname(p))
    for p in glob.glob(os.path.join(root, "results", "*", "table.md"))
    if os.path.exists(
      os.path.join(root, "experiments", os.path.basename(os.path.dirname(p)) + ".py")
    )
  )


def config_file(name: str, root: str = ROOT) -> str:
  return os.path.join(root, "experiments", name + ".py")


def load(name: str, root: str = ROOT):
  """(the config module, its sweep, the committed runs, the base-health records)."""
  module = load_config_module(config_file(name, root))
  sweep = sweep_of(module)
  folder = os.path.join(root, "results", name)
  records = ptio.read_jsonl(os.path.join(folder, "runs.jsonl"))
  bases_path = os.path.join(folder, BASES)
  bases = ptio.read_jsonl(bases_path) if os.path.exists(bases_path) else []
  return module, sweep, records, bases


def recompute(name: str, root: str = ROOT) -> str:
  """table.md as the current code and config write it from the committed files (nothing runs);
  the committed table.md is left alone."""
  folder = os.path.join(root, "results", name)
  with tempfile.TemporaryDirectory() as tmp:
    for f in ("runs.jsonl", "command.txt", BASES, rerun_check.JSON, "environment.jsonl"):
      if os.path.exists(os.path.join(folder, f)):
        shutil.copy(os.path.join(folder, f), tmp)
    return rewrite_report(config_file(name, root), out_dir=tmp)


def judged(name: str, root: str = ROOT) -> tuple[str, list]:
  """(verdict, the parts' results) of a table, by the rule, from its committed runs."""
  _, sweep, records, _ = load(name, root)
  by_arm = verdicts.by_arm_of(records)
  results = verdicts.results_of(sweep.claim, by_arm, sweep.baseline, sweep.arms)
  return verdicts.verdict(results), results


def _verdict(sweep, records, v: str) -> str:
  """The verdict, with the declared mechanism check's count when it engaged in fewer than
  half the seeds (report.engagement_line)."""
  check = sweep.get("engaged", None)
  if check is None:
    return v
  engaged, seeds = verdicts.engagement(check, verdicts.by_arm_of(records))
  if seeds and 2 * engaged >= seeds:
    return v
  return f"{v} (mechanism engaged in {engaged} of {seeds} seeds)"


def _cell(text: str) -> str:
  return " ".join(str(text).split()).replace("|", "\\|")


def _tested(results: list) -> str:
  """The parts' differences and p-values, compact: what the verdict rests on."""
  out = []
  for r in results:
    p = r.part
    versus = "its start" if p.control == "start" else (p.versus or f"{p.value:g}")
    if r.status == "not measured" or math.isnan(r.diff):
      out.append(f"{p.arm} vs {versus}: not measured")
      continue
    tail = "void: it scored 0" if r.status == "void" else f"p = {r.p:.2g}"
    out.append(f"{p.arm} − {versus}: {r.diff:+.3f} ({tail})")
  seeds = max((r.seeds for r in results), default=0)
  return f"{'; '.join(out)} on {results[0].part.metric}, {seeds} seeds" if out else ""


def _rerun(name: str, root: str = ROOT) -> str:
  """The table's last rerun check (sweeps/rerun_check.py), in a few words."""
  result = rerun_check.read(os.path.join(root, "results", name))
  return "none yet" if result is None else _rerun_words(result)


def _rerun_words(result: dict) -> str:
  """A rerun check's result (rerun.json) in a few words."""
  seeds = f"seed {', '.join(map(str, result['seeds']))}"
  if result["identical"]:
    return f"identical ({seeds})"
  v = result["verdict"]
  holds = "verdict holds" if not v["changed"] else f"verdict would be {v['after']}"
  off_clock = rerun_check.identical_off_clock(result)
  top, _ = rerun_check.largest(result, clock=off_clock)
  change = "identical but for clock metrics" if off_clock else "differs"
  if top:
    rel = top[1].get("relative", math.nan)
    scale = f", {rel:.2g} seed SDs" if math.isfinite(rel) else ""
    largest = f"largest change {top[1]['max_abs_diff']:.3g} in {top[0]}{scale}"
    change = f"{change}: {largest}" if off_clock else largest
  return f"{change} ({seeds}); {holds}"


def readme_table(root: str = ROOT) -> str:
  rows = []
  for name in names(root):
    _, sweep, records, _ = load(name, root)
    v, results = judged(name, root)
    link = f"[{name}](results/{name}/table.md)"
    cell = _verdict(sweep, records, v)
    rows.append(
      [
        _cell(sweep.title),
        _cell(sweep.claim.text),
        cell,
        _cell(_tested(results)),
        _cell(_rerun(name, root)),
        link,
      ]
    )
  counts = {v: [r[2].split(" (")[0] for r in rows].count(v) for v in verdicts.VERDICTS}
  summary = (
    f"Verdicts: {counts['reproduced']} reproduced, {counts['partly reproduced']} partly "
    f"reproduced, {counts['not significant']} not significant, {counts['contradicted']} "
    "contradicted."
  )
  header = ["setting", "paper's claim", "verdict", "tested", "rerun check", "table"]
  table = ptio.format_table(header, rows)
  return summary + "\n\n" + table


def experiments_table(root: str = ROOT) -> str:
  rows = []
  for name in names(root):
    module, sweep, records, bases = load(name, root)
    v, _ = judged(name, root)
    v = _verdict(sweep, records, v)
    setting = report.mechanism(module.__doc__) or "not stated in the config"
    folder = os.path.join(root, "results", name)
    extra = sorted(f for f in os.listdir(folder) if f.endswith(".md") and f not in CORE)
    also = ", ".join(f"[{f}](../results/{name}/{f})" for f in extra)
    gate = (
      report.gate_line(sweep.get("base_health", None), bases)
      if tuple(sweep.get("shared_stages", ()))
      else "The arms share no stage."
    )
    rows.append(
      [
        f"[{name}](../results/{name}/table.md)",
        _cell(sweep.claim.text),
        f"**{v}**",
        _cell(f"{setting} {gate}" + (f" Also: {also}." if also else "")),
      ]
    )
  return ptio.format_table(["reproduction", "claim", "verdict", "setting"], rows)


def with_block(text: str, block: str, path: str) -> str:
  """``text`` with the part between START and END replaced by ``block``."""
  if START not in text or END not in text:
    raise ValueError(f"{path} lacks the markers {START!r} and {END!r}")
  head, rest = text.split(START, 1)
  tail = rest.split(END, 1)[1]
  return f"{head}{START}\n{block}\n{END}{tail}"


def documents(root: str = ROOT) -> dict[str, str]:
  """{path: the text it should have}: README.md and docs/experiments.md with their blocks."""
  out = {}
  for path, block in (
    (os.path.join(root, "README.md"), readme_table(root)),
    (os.path.join(root, "docs", "experiments.md"), experiments_table(root)),
  ):
    with open(path, encoding="utf-8") as f:
      out[path] = with_block(f.read(), block, path)
  return out


def main(argv=None) -> int:
  import sys  # pylint: disable=import-outside-toplevel

  argv = sys.argv[1:] if argv is None else argv
  stale = []
  for path, text in documents().items():
    with open(path, encoding="utf-8") as f:
      current = f.read()
    if current == text:
      continue
    if "--check" in argv:
      stale.append(path)
    else:
      with open(path, "w", encoding="utf-8") as f:
        f.write(text)
      print(f"wrote {os.path.relpath(path, ROOT)}")
  for path in stale:
    print(OUT_OF_DATE.format(os.path.relpath(path, ROOT)), file=sys.stderr)
  return 1 if stale else 0
