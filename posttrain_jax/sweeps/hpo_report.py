"""The report of a hyperparameter study (sweeps/hpo.py): ``trials.md`` (every trial, its values
per rung, state and cost), ``summary.json`` (the best configuration and the study's numbers, the
record a reproduction's table reads) and Optuna's history and parameter-importance plots
(``history.png``, ``importance.png``), all computed from the study's database."""

import json
import math
import os

import numpy as np

SUMMARY, TRIALS_TABLE = "summary.json", "trials.md"


def rank_correlation(trials, settings: dict) -> tuple[float, int]:
  """Spearman's rho between the trials' values at the last rung of the first variant and at the
  last rung of the final variant (proxy vs target ranking), over the trials that reached both;
  (NaN, n) when the study has one variant or fewer than 3 such trials."""
  from scipy import stats  # pylint: disable=import-outside-toplevel

  rungs = settings["rungs"]
  first, final = rungs[0]["variant"], rungs[-1]["variant"]
  if first == final:
    return math.nan, 0
  proxy_k = max(k for k, r in enumerate(rungs) if r["variant"] == first)
  pairs = [
    (t.user_attrs["rungs"][proxy_k]["value"], t.user_attrs["rungs"][-1]["value"])
    for t in trials
    if len(t.user_attrs.get("rungs", [])) == len(rungs)
  ]
  if len(pairs) < 3:
    return math.nan, len(pairs)
  a, b = np.array(pairs).T
  if np.ptp(a) == 0 or np.ptp(b) == 0:
    return math.nan, len(pairs)
  return float(stats.spearmanr(a, b).statistic), len(pairs)


def _fmt(v) -> str:
  if isinstance(v, float):
    return f"{v:.4g}"
  return str(v)


def table(trials, settings: dict) -> str:
  names = sorted({n for t in trials for n in t.params})
  rungs = settings["rungs"]
  head = ["trial", "state", *names]
  head += [f"{r['variant']} {r['steps']}" for r in rungs] + ["value", "CPU-s", "stopped by"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for t in trials:
    values = [r["value"] for r in t.user_attrs.get("rungs", [])]
    row = [str(t.number), t.state.name.lower(), *(_fmt(t.params.get(n, "")) for n in names)]
    row += [f"{v:.3f}" for v in values] + [""] * (len(rungs) - len(values))
    row += [
      "" if t.value is None else f"{t.value:.4f}",
      f"{t.user_attrs.get('cpu_s', 0.0):.0f}",
      t.user_attrs.get("stopped_by", ""),
    ]
    lines.append("| " + " | ".join(row) + " |")
  return "\n".join(lines)


def plots(study, out_dir: str) -> list[str]:
  """Optuna's optimisation history and parameter importances as PNG (importances need two
  finished trials that differ); the files written."""
  import matplotlib  # pylint: disable=import-outside-toplevel

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  import optuna  # pylint: disable=import-outside-toplevel
  from optuna.visualization import matplotlib as ovm  # pylint: disable=import-outside-toplevel

  written = []
  complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
  draws = [("history.png", ovm.plot_optimization_history)]
  if len(complete) >= 2 and len({t.value for t in complete}) > 1 and complete[0].params:
    draws.append(("importance.png", ovm.plot_param_importances))
  for name, draw in draws:
    try:
      ax = draw(study)
    except (ValueError, RuntimeError) as e:  # e.g. importances of a parameter that never varied
      print(f"[hpo] {name} not drawn: {e}")
      continue
    ax.figure.savefig(os.path.join(out_dir, name), dpi=100, bbox_inches="tight")
    plt.close(ax.figure)
    written.append(name)
  return written


def base_accuracy(bases_dir: str, variant: str, key: str = "eval/accuracy") -> float:
  """The last ``key`` of the variant's base (its pretraining's records); NaN without one."""
  path = os.path.join(bases_dir, variant, "pretrain", "metrics.jsonl")
  if not os.path.exists(path):
    return math.nan
  with open(path, encoding="utf-8") as f:
    values = [r[key] for r in map(json.loads, filter(str.strip, f)) if key in r]
  return float(values[-1]) if values else math.nan


def summary(study, settings: dict, seed: int, bases_dir: str = "") -> dict:
  import optuna  # pylint: disable=import-outside-toplevel

  trials = study.get_trials(deepcopy=False)
  state = optuna.trial.TrialState
  complete = [t for t in trials if t.state == state.COMPLETE]
  best = None
  if complete:
    best = max(complete, key=lambda t: t.value if settings["direction"] == "maximize" else -t.value)
  rho, n_pairs = rank_correlation(trials, settings)
  ran = [t for t in trials if t.user_attrs.get("rungs")]
  cpu = sum(t.user_attrs.get("cpu_s", 0.0) for t in trials)
  return {
    "seed": seed,
    "best_value": best.value if best else math.nan,
    "best_params": best.params if best else {},
    "best_trial": best.number if best else -1,
    "trials": len(ran),
    "trials_complete": len(complete),
    "trials_pruned": sum(1 for t in ran if t.user_attrs.get("stopped_by", "").startswith("pruned")),
    "trials_stopped": sum(
      1
      for t in ran
      if t.user_attrs.get("stopped_by")
      and not t.user_attrs["stopped_by"].startswith(("pruned", "budget"))
    ),
    "cpu_s": cpu,
    "cpu_s_per_trial": cpu / len(ran) if ran else math.nan,
    "proxy_target_spearman": rho,
    "proxy_target_pairs": n_pairs,
    "budget_s": settings["budget_s"],
    **{f"base_{v}_accuracy": base_accuracy(bases_dir, v) for v in settings["variants"]},
  }


def report(study, run) -> dict:
  """Writes trials.md, summary.json and the plots into the study folder of ``run`` (a
  ``sweeps.hpo.Study``); returns the summary."""
  out_dir = run.study_dir
  out = summary(study, run.settings, run.seed, run.bases_dir)
  trials = study.get_trials(deepcopy=False)
  text = [
    f"# Study of {os.path.basename(run.config_file)} ({run.config_arg or 'default'})",
    "",
    f"Sampler {run.settings['sampler']}, metric {run.settings['metric']} "
    f"({run.settings['direction']}), rungs "
    + ", ".join(f"{r['variant']} {r['steps']} steps" for r in run.settings["rungs"])
    + f", eta {run.settings['eta']}; {out['trials']} trials, {out['cpu_s']:.0f} CPU-seconds.",
    "",
    table(trials, run.settings),
    "",
    f"Best: trial {out['best_trial']}, {run.settings['metric']} {out['best_value']:.4f}, "
    + json.dumps(out["best_params"], sort_keys=True),
  ]
  with open(os.path.join(out_dir, TRIALS_TABLE), "w", encoding="utf-8") as f:
    f.write("\n".join(text) + "\n")
  with open(os.path.join(out_dir, SUMMARY), "w", encoding="utf-8") as f:
    json.dump(out, f, indent=1, sort_keys=True)
  plots(study, out_dir)
  run.echo("\n".join(text))
  return out
