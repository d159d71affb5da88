#!/usr/bin/env python
"""The OPSD predictive law: ``python scripts/opsd_law.py --seeds 5``.

Runs experiments/opsd_law.py's configurations x seeds through scripts/reproduce.py (resumable;
results/opsd_law/ gets its table), then fits Delta = a G0 + b over the configurations
(posttrain_jax/analysis/opsd_law.py) and writes results/opsd_law/law.md and law.png: per
configuration the mean initial gap G0 and gain Delta over seeds, the slope, R² and the
leave-one-configuration-out error.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from posttrain_jax import io as ptio  # noqa: E402
from posttrain_jax.analysis import opsd_law as law  # noqa: E402
from posttrain_jax.sweeps.reproduce import load_config_module, reproduce  # noqa: E402

CONFIG = os.path.join("experiments", "opsd_law.py")


def write_law(out_dir: str, arms, seeds: int, command: str) -> str:
  """Fits the law over ``out_dir``'s runs; writes law.md and law.png; returns the text."""
  points = law.law_points(os.path.join(out_dir, "runs.jsonl"), arms)
  fit = law.fit_law([p["g0"] for p in points], [p["delta"] for p in points])
  rows = [[p["arm"], p["seeds"], p["g0"], p["delta"]] for p in points]
  verdict = (
    "a positive linear relation (slope > 0, R² >= 0.5)"
    if fit["slope"] > 0 and fit["r2"] >= 0.5
    else "no clear positive linear relation"
  )
  text = "\n".join(
    [
      "# OPSD predictive law: initial gap G0 vs gain Delta",
      "",
      "Claim: the initial gap between the self-teacher (policy with the privileged context) "
      "and the student predicts the final OPSD gain linearly across context designs. "
      f"Observed over {fit['n']} configurations x {seeds} seeds: Delta = "
      f"{fit['slope']:.3f} G0 + {fit['intercept']:+.3f}, R² = {fit['r2']:.3f}, "
      f"leave-one-configuration-out RMSE = {fit['loco_rmse']:.4f}: {verdict}.",
      "",
      ptio.format_table(["configuration", "seeds", "G0 (mean)", "Delta (mean)"], rows),
      "",
      "G0: greedy accuracy with the context minus without it, at RL step 0 (the same 200 "
      "held-out problems); Delta: greedy accuracy after minus before the RL stage (1,000 "
      "held-out problems).",
      "",
      f"Command: `{command}`",
      "",
    ]
  )
  with open(os.path.join(out_dir, "law.md"), "w", encoding="utf-8") as f:
    f.write(text)
  fig, ax = plt.subplots(figsize=(5, 4))
  for i, p in enumerate(points):  # one colour per configuration: its runs and their mean
    ax.scatter(p["g0_runs"], p["delta_runs"], s=8, alpha=0.3, color=f"C{i % 10}")
    ax.scatter(
      [p["g0"]], [p["delta"]], s=40, label=p["arm"], color=f"C{i % 10}", marker="os^"[i // 10 % 3]
    )
  xs = [min(p["g0"] for p in points), max(p["g0"] for p in points)]
  ax.plot(
    xs, [fit["slope"] * x + fit["intercept"] for x in xs], "k--", label=f"fit, R²={fit['r2']:.2f}"
  )
  ax.set_xlabel("initial gap G0")
  ax.set_ylabel("gain Delta")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "law.png"), dpi=110)
  plt.close(fig)
  return text


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, default=5)
  parser.add_argument("--smoke", action="store_true", help="run the smoke variant")
  parser.add_argument("--out", default=None, help="output folder (default results/opsd_law)")
  parser.add_argument("--workers", type=int, default=None)
  args = parser.parse_args()
  out = args.out or os.path.join("results", "opsd_law" + ("_smoke" if args.smoke else ""))
  try:
    print(reproduce(CONFIG, args.seeds, smoke=args.smoke, out_dir=out, workers=args.workers))
    arg = "smoke" if args.smoke else None
    arms = load_config_module(CONFIG).get_config(arg).sweep.arms
    command = f"python scripts/opsd_law.py --seeds {args.seeds}" + (
      " --smoke" if args.smoke else ""
    )
    print(write_law(out, arms, args.seeds, command))
  except (FileNotFoundError, ValueError, RuntimeError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
