"""Substrate diagnostics of the environment suite, written as a markdown report.

  python scripts/env_diagnostics.py --out=results/env_diagnostics.md
  python scripts/env_diagnostics.py --envs=tron/sub,tron/bool --seeds=3 --json=/tmp/diag.json
  python scripts/env_diagnostics.py --solver=my_module:solve   # a solve(prompts) -> completions

Sections: generation reliability, verifier self-consistency, instance diversity per level,
cross-environment near-duplicates, pass rate per level (falls with level for a sensible solver).
Without --solver the pass-rate section uses a noisy oracle (errs more on longer instances), a
stand-in until a model's greedy decoder is plugged in.
"""

import argparse
import importlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from posttrain_jax import envs  # pylint: disable=wrong-import-position
from posttrain_jax.envs import diagnostics  # pylint: disable=wrong-import-position


def _load_solver(spec: str):
  module, _, attr = spec.partition(":")
  if not attr:
    raise SystemExit(f"--solver must be module:function, got {spec!r}")
  return getattr(importlib.import_module(module), attr)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--envs",
    default="",
    help="comma-separated names (default: every registered env that is not a mixture)",
  )
  parser.add_argument("--seeds", type=int, default=10, help="generator seeds per level")
  parser.add_argument("--n", type=int, default=20, help="instances per generator call")
  parser.add_argument("--diversity-n", type=int, default=1000)
  parser.add_argument("--dup-per-level", type=int, default=100)
  parser.add_argument("--threshold", type=float, default=0.8, help="n-gram Jaccard threshold")
  parser.add_argument("--ngram", type=int, default=3)
  parser.add_argument("--consistency-n", type=int, default=200)
  parser.add_argument("--pass-n", type=int, default=128)
  parser.add_argument("--solver", default="", help="module:function, solve(prompts)->completions")
  parser.add_argument("--out", default="results/env_diagnostics.md")
  parser.add_argument("--json", default="", help="also write the raw result here")
  args = parser.parse_args(argv)

  names = [n for n in args.envs.split(",") if n] or list(diagnostics.base_envs(envs.ENVS))
  selected = {n: envs.get_env(n) for n in names}
  start = time.time()
  result = diagnostics.run(
    selected,
    seeds=range(args.seeds),
    n=args.n,
    diversity_n=args.diversity_n,
    dup_per_level=args.dup_per_level,
    consistency_n=args.consistency_n,
    pass_n=args.pass_n,
    solve=_load_solver(args.solver) if args.solver else None,
    threshold=args.threshold,
    ngram=args.ngram,
  )
  report = diagnostics.report_markdown(result)
  report += (
    f"\nCommand: `python scripts/env_diagnostics.py {' '.join(argv or sys.argv[1:])}` "
    f"({time.time() - start:.1f} s)\n"
  )
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as f:
    f.write(report)
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=1, sort_keys=True, default=str)
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
