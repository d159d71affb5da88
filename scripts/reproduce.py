#!/usr/bin/env python
"""Reproduce a paper table: ``python scripts/reproduce.py experiments/NAME.py --seeds 3``.

Runs the config's arms x seeds (shared base checkpoint per seed, arms in parallel processes,
resumable) and writes results/NAME/ (table.md, runs.jsonl, curves.png, command.txt, the
environment record environment.jsonl). ``--check`` reruns recorded seeds and writes rerun.md.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from posttrain_jax.sweeps.reproduce import check, reproduce, rewrite_report  # noqa: E402


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("config", help="experiments/NAME.py")
  parser.add_argument(
    "--seeds", type=int, default=None, help="seeds to run (default 3; with --check: 1)"
  )
  parser.add_argument(
    "--check",
    action="store_true",
    help="rerun the first --seeds of the table's recorded seeds in results/NAME/check/ and "
    "write rerun.md: recorded vs rerun per arm and metric, and whether the verdict changes "
    "(docs/reproducibility.md)",
  )
  parser.add_argument("--smoke", action="store_true", help="run the smoke variant")
  parser.add_argument("--out", default=None, help="output folder (default results/NAME)")
  parser.add_argument(
    "--workers",
    type=int,
    default=None,
    help="parallel runs, each its own process (default: cores); 0: one after "
    "another in this process (fastest for small sweeps: one start-up, "
    "programs compiled once)",
  )
  parser.add_argument(
    "--backend",
    choices=("local", "ray"),
    default="local",
    help="where the runs go: local processes, or Ray tasks (pip install -e '.[ray]'; "
    "docs/scale.md)",
  )
  parser.add_argument(
    "--ray-address",
    default=None,
    help="with --backend ray: the cluster's address (default RAY_ADDRESS, else a local "
    "cluster started for the sweep)",
  )
  parser.add_argument(
    "--report-only",
    action="store_true",
    help="rewrite table.md from the recorded runs.jsonl (e.g. after editing "
    "the config's notes); runs nothing",
  )
  parser.add_argument(
    "--gate-after-runs",
    action="store_true",
    help="with --report-only: check the config's base-health gate on the recorded runs (a "
    "table made before its gate was declared) and write bases.jsonl",
  )
  args = parser.parse_args()
  try:
    if args.report_only:
      text = rewrite_report(
        args.config, smoke=args.smoke, out_dir=args.out, gate_after_runs=args.gate_after_runs
      )
    else:  # a check reruns 1 recorded seed by default, a sweep runs 3
      program, default_seeds = (check, 1) if args.check else (reproduce, 3)
      text = program(
        args.config,
        default_seeds if args.seeds is None else args.seeds,
        smoke=args.smoke,
        out_dir=args.out,
        workers=args.workers,
        backend=args.backend,
        ray_address=args.ray_address,
      )
  except (FileNotFoundError, ValueError, RuntimeError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
