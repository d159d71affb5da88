"""Runs the Libra simulation (experiments/libra.py) over its arms x seeds and writes
results/libra/ (table.md, runs.jsonl, command.txt): ``python scripts/libra.py [--seeds N]``."""

import argparse
import importlib.util
import os
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, REPO)

from posttrain_jax.sweeps import report  # noqa: E402


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--seeds", type=int, default=None, help="default: the config's SEEDS")
  parser.add_argument("--out", default=os.path.join(REPO, "results", "libra"))
  args = parser.parse_args(argv)
  spec = importlib.util.spec_from_file_location("libra_experiment",
                                                os.path.join(REPO, "experiments", "libra.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  seeds = args.seeds or module.SEEDS
  records = [module.run_arm(arm, seed) for arm in module.ARMS for seed in range(seeds)]
  command = "python scripts/libra.py" + (f" --seeds {args.seeds}" if args.seeds else "")
  text = report.write_report(args.out, module.sweep(), records, command,
                             setting=report.mechanism(module.__doc__), curves=False)
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
