#!/usr/bin/env python
"""Gradient variance of a reproduction config's advantage estimators, on the same rollouts.

    python scripts/grad_variance.py experiments/maxpo_sparse.py --seeds 5 --batches 64

The seeds are the table's: those recorded in ``results/NAME/runs.jsonl`` (after the base-health
gate's replacements), the first ``--seeds`` of them; 0, 1, ... when there is no table yet.
Reads the shared pretraining checkpoint of each seed from ``results/NAME/runs/seed{S}/base``
(made by ``scripts/reproduce.py``; ``--stage rl --arm ARM`` reads an arm's RL result instead)
and writes ``results/NAME/grad_variance.md`` and ``.jsonl``.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from posttrain_jax.sweeps import grad_variance  # noqa: E402


def table_seeds(path: str) -> list[int]:
  """The seeds a committed table used (``runs.jsonl``), sorted; [] without one."""
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    return sorted({json.loads(line)["seed"] for line in f if line.strip()})


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("config", help="experiments/NAME.py (a reproduction config)")
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--batches", type=int, default=64)
  parser.add_argument("--stage", default="pretrain", help="whose final params: pretrain or rl")
  parser.add_argument("--arm", default="base", help="run folder under runs/seed{S}/")
  parser.add_argument("--runs", default=None, help="default results/NAME/runs")
  parser.add_argument("--out", default=None, help="default results/NAME/grad_variance.md")
  parser.add_argument("--smoke", action="store_true")
  args = parser.parse_args()
  name = os.path.splitext(os.path.basename(args.config))[0]
  runs = args.runs or os.path.join("results", name, "runs")
  out = args.out or os.path.join("results", name, "grad_variance.md")
  command = " ".join(["python", "scripts/grad_variance.py", *sys.argv[1:]])
  seeds = table_seeds(os.path.join(os.path.dirname(runs), "runs.jsonl"))[: args.seeds]
  seeds = seeds or list(range(args.seeds))
  try:
    results = [
      grad_variance.measure(
        args.config,
        os.path.join(runs, f"seed{s}", args.arm),
        batches=args.batches,
        stage=args.stage,
        seed=s,
        smoke=args.smoke,
      )
      for s in seeds
    ]
  except (FileNotFoundError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(grad_variance.write_report(out, results, command))
  return 0


if __name__ == "__main__":
  sys.exit(main())
