"""Runs a Libra experiment over its arms x seeds and writes results/<name>/ (table.md,
runs.jsonl, command.txt): the simulation by default, or the real-rollout benchmark::

    python scripts/libra.py [--seeds N]                                # experiments/libra.py
    python scripts/libra.py experiments/libra_rollouts.py [--seeds N]  # real rollouts

The config module gives ``SEEDS``, ``run_seed(seed) -> [records]`` and ``sweep()``."""

import argparse
import importlib.util
import os
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, REPO)

from posttrain_jax.sweeps import report  # noqa: E402

DEFAULT = os.path.join("experiments", "libra.py")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("config", nargs="?", default=DEFAULT, help=f"default {DEFAULT}")
  parser.add_argument("--seeds", type=int, default=None, help="default: the config's SEEDS")
  parser.add_argument("--out", default=None, help="default results/<config name>")
  args = parser.parse_args(argv)
  path = args.config if os.path.isabs(args.config) else os.path.join(REPO, args.config)
  name = os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(f"{name}_experiment", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  seeds = args.seeds or module.SEEDS
  records = []
  for seed in range(seeds):
    records += module.run_seed(seed)
    print(f"[{name}] seed {seed} done", flush=True)
  command = (
    "python scripts/libra.py"
    + ("" if args.config == DEFAULT else f" {args.config}")
    + (f" --seeds {args.seeds}" if args.seeds else "")
  )
  out = args.out or os.path.join(REPO, "results", name)
  text = report.write_report(
    out,
    module.sweep(),
    records,
    command,
    setting=report.mechanism(module.__doc__),
    curves=False,
    changed=report.changes(module.__doc__),
  )
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
