"""Pilot runs: one seed of a reproduction config in a trial setting, before its table.

A pilot answers "can the mechanism show here?" (docs/experiments.md, "Pilots"): it runs the
config's shared stages and some of its arms for one seed with ``--config.KEY=VALUE`` overrides,
and keeps what the table will need to decide that (each arm's summary, its RL curve of the
config's ``eval.rl_summary`` metrics) in ``results/NAME/pilots/LABEL_seedS.json``. ``pilots.md``
beside them is rendered from every pilot JSON in the folder, so each number in it comes from a
committed file; the config's docstring says what changed because of them.

    python scripts/pilot.py experiments/echorl.py --name level2 \
        --label "level 2, temperature 0.7" --arms grpo,echorl -- --config.env.level=2
"""

from __future__ import annotations

import datetime
import glob
import json
import math
import os

from posttrain_jax.sweeps.reproduce import (
  cpu_threads_of,
  current_commit,
  load_config_module,
  make_pool,
  run_sweep,
  sweep_of,
)

HEADER = (
  "Pilots of `{config}`: one seed each, run with `scripts/pilot.py` before the table "
  "(docs/experiments.md, \"Pilots\"). Every number below is read from the JSON file named in "
  "its row (the arm's summary.json and its RL metrics); the config's docstring says what "
  "changed because of them."
)


def _read_json(path: str) -> dict:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def curve(workdir: str, keys) -> list[dict]:
  """The RL stage's logged ``keys`` per step (``workdir/rl/metrics.jsonl``); [] without RL."""
  path = os.path.join(workdir, "rl", "metrics.jsonl")
  if not os.path.exists(path):
    return []
  rows = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      row = json.loads(line)
      kept = {k: row[k] for k in keys if k in row}
      if kept:
        rows.append({"step": row.get("step"), **kept})
  return rows


def pilot_file(out_dir: str, name: str, seed: int) -> str:
  return os.path.join(out_dir, f"{name}_seed{seed}.json")


def run_pilot(
  config_file: str,
  name: str,
  label: str,
  *,
  overrides: tuple = (),
  arms=None,
  seed: int = 0,
  workers: int | None = None,
  out_dir: str | None = None,
  echo=print,
) -> str:
  """Runs the pilot (resumable: its runs live in ``OUT/work/NAME``), writes its JSON and
  re-renders ``pilots.md``; returns the rendered text."""
  if not name or not all(c.isalnum() or c in "_-" for c in name):
    raise ValueError(f"pilot name {name!r}: use letters, digits, '_' or '-' (it names a file)")
  bad = [o for o in overrides if not o.startswith("--config.") or "=" not in o]
  if bad:
    raise ValueError(f"overrides must read --config.KEY=VALUE, got {bad}")
  module = load_config_module(config_file)
  sweep = sweep_of(module)
  chosen = tuple(arms) if arms else tuple(sweep.arms)
  unknown = sorted(set(chosen) - set(sweep.arms))
  if unknown:
    raise ValueError(f"{config_file} has no arm(s) {unknown}; its arms: {list(sweep.arms)}")
  config_name = os.path.splitext(os.path.basename(config_file))[0]
  out_dir = out_dir or os.path.join("results", config_name, "pilots")
  sub = sweep.copy_and_resolve_references()
  with sub.unlocked():
    sub.arms = chosen
  pool, workers = make_pool("local", workers, None, cpu_threads_of(module, sweep, False))
  run = run_sweep(
    config_file,
    module,
    sub,
    seeds=1,
    out_dir=os.path.join(out_dir, "work", name),
    pool=pool,
    seed_list=[seed],
    overrides=tuple(overrides),
    echo=echo,
  )
  if run.failed:
    raise RuntimeError(
      f"{len(run.failed)} pilot run(s) failed: {', '.join(j.name for j in run.failed)}; logs in "
      f"{os.path.join(out_dir, 'work', name, 'logs')}; rerun the same command to resume"
    )
  keys = tuple(module.get_config(f"arm={chosen[0]},seed={seed}").eval.get("rl_summary", ()))
  data = {
    "meta": {
      "label": label,
      "overrides": list(overrides),
      "arms": list(chosen),
      "seed": seed,
      "commit": current_commit(),
      "made": datetime.date.today().isoformat(),
      "command": " ".join(
        ["python scripts/pilot.py", config_file, f"--name {name}", f"--seed {seed}"]
        + [f"--arms {','.join(chosen)}"]
        + (["--", *overrides] if overrides else [])
      ),
    }
  }
  base = os.path.join(out_dir, "work", name, "runs", f"seed{seed}", "base", "summary.json")
  if os.path.exists(base):
    data["base"] = _read_json(base)
  for record in run.records:
    summary = {k: v for k, v in record.items() if k not in ("workdir", "wall_s")}
    data[record["arm"]] = summary
    data[record["arm"] + "_curve"] = curve(record["workdir"], keys)
  with open(pilot_file(out_dir, name, seed), "w", encoding="utf-8") as f:
    json.dump(data, f, indent=1, sort_keys=True)
  return render(out_dir, config_file, sweep)


def columns(sweep) -> list[str]:
  """The pilot table's metrics: the base's accuracy, the sweep's metrics, and the largest value
  of the mechanism check's metric (an RL mean hides a mechanism that engaged only late)."""
  cols = ["accuracy_before_rl"] + [m for m in sweep.metrics if m != "accuracy_before_rl"]
  engaged = sweep.get("engaged", None)
  if engaged is not None and engaged.metric.startswith("rl_mean/"):
    cols.append("rl_max/" + engaged.metric[len("rl_mean/") :])
  return cols + [m for m in ("rl_mean/reward/mean",) if m not in cols]


def _fmt(value) -> str:
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    return "nan" if math.isnan(value) else f"{value:.4f}"
  return "–" if value is None else str(value)


def engaged_line(sweep, summary: dict) -> str:
  """Whether the config's declared mechanism check would pass on this arm's run."""
  gate = sweep.get("engaged", None)
  if gate is None or gate.metric not in summary:
    return ""
  value = summary[gate.metric]
  ok = value is not None and not math.isnan(value) and value > gate.above
  return f"{'yes' if ok else 'no'} ({gate.metric} {_fmt(value)} vs > {gate.above})"


def render(out_dir: str, config_file: str, sweep) -> str:
  """Writes ``pilots.md`` from every pilot JSON in ``out_dir``; returns its text."""
  cols = columns(sweep)
  engaged = sweep.get("engaged", None)
  lines = [f"# {os.path.splitext(os.path.basename(config_file))[0]} pilots", ""]
  lines += [HEADER.format(config=config_file), ""]
  head = ["pilot", "file", "arm", *cols]
  if engaged is not None:
    head.append(f"mechanism check ({engaged.arm})")
  lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for path in sorted(glob.glob(os.path.join(out_dir, "*.json"))):
    data = _read_json(path)
    meta = data.get("meta", {})
    label = meta.get("label", os.path.basename(path))
    arms = meta.get("arms") or [k for k in data if k not in ("meta", "base") and "_curve" not in k]
    for arm in arms:
      if arm not in data:
        continue
      row = [label, os.path.basename(path), arm, *(_fmt(data[arm].get(c)) for c in cols)]
      if engaged is not None:
        row.append(engaged_line(sweep, data[arm]) if arm == engaged.arm else "")
      lines.append("| " + " | ".join(row) + " |")
  lines += ["", "Settings (overrides of the committed config):", ""]
  for path in sorted(glob.glob(os.path.join(out_dir, "*.json"))):
    meta = _read_json(path).get("meta", {})
    given = " ".join(meta.get("overrides", ())) or "none (the config as committed then)"
    lines.append(f"- `{os.path.basename(path)}`: {given}")
  text = "\n".join(lines) + "\n"
  with open(os.path.join(out_dir, "pilots.md"), "w", encoding="utf-8") as f:
    f.write(text)
  return text
