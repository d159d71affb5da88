"""Runs a Libra experiment over its arms x seeds and writes results/<name>/ (table.md,
runs.jsonl, command.txt): the simulation by default, or the real-rollout benchmark::

    python scripts/libra.py [--seeds N]                                # experiments/libra.py
    python scripts/libra.py experiments/libra_rollouts.py [--seeds N]  # real rollouts
    python scripts/libra.py experiments/libra_rollouts.py --check      # rerun seed 0: rerun.md

The config module gives ``SEEDS``, ``run_seed(seed) -> [records]`` and ``sweep()``."""

import argparse
import importlib.util
import os
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, REPO)

from posttrain_jax import io as ptio  # noqa: E402
from posttrain_jax.parallel import host  # noqa: E402
from posttrain_jax.sweeps import environment, report, rerun_check  # noqa: E402
from posttrain_jax.sweeps.reproduce import retire_table  # noqa: E402

DEFAULT = os.path.join("experiments", "libra.py")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("config", nargs="?", default=DEFAULT, help=f"default {DEFAULT}")
  parser.add_argument("--seeds", type=int, default=None, help="default: the config's SEEDS")
  parser.add_argument("--out", default=None, help="default results/<config name>")
  parser.add_argument(
    "--check",
    action="store_true",
    help="rerun the first --seeds (default 1) recorded seeds and write rerun.md "
    "(docs/reproducibility.md)",
  )
  args = parser.parse_args(argv)
  host.set_cpu_threads(THREADS)
  path = args.config if os.path.isabs(args.config) else os.path.join(REPO, args.config)
  name = os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(f"{name}_experiment", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  out = args.out or os.path.join(REPO, "results", name)
  command = (
    "python scripts/libra.py"
    + ("" if args.config == DEFAULT else f" {args.config}")
    + (f" --seeds {args.seeds}" if args.seeds else "")
  )
  started = environment.now()
  if args.check:
    return check(module, name, out, args.seeds or 1, command + " --check", started)
  seeds = args.seeds or module.SEEDS
  records = []
  for seed in range(seeds):
    records += module.run_seed(seed)
    print(f"[{name}] seed {seed} done", flush=True)
  environment.append(out, _record(started, command, len(records)))
  retire_table(out, records, module.__doc__)
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


THREADS = 2  # XLA:CPU's pool, as config.cpu_threads' default (the real-rollout benchmark)


def _record(started: str, command: str, runs: int) -> dict:
  return environment.record(
    backend="in process",
    workers=0,
    cpu_threads=THREADS,
    started=started,
    jobs_run=runs,
    jobs_cached=0,
    command=command,
  )


def check(module, name: str, out: str, seeds: int, command: str, started: str) -> int:
  """Reruns the first ``seeds`` recorded seeds and writes rerun.json / rerun.md, then the table
  with its rerun line (sweeps/rerun_check.py)."""
  recorded = ptio.read_jsonl(os.path.join(out, "runs.jsonl"))
  sweep = module.sweep()
  chosen = sorted({r["seed"] for r in recorded})[:seeds]
  rerun = [r for s in chosen for r in module.run_seed(s)]
  env = {
    "rerun_environment": _record(started, command, len(rerun)),
    "recorded_environment": rerun_check.last_environment(out),
  }
  result = rerun_check.summarise(sweep, recorded, rerun, chosen, env)
  print(rerun_check.write(out, sweep.title, result, command))
  with open(os.path.join(out, "command.txt"), encoding="utf-8") as f:
    table_command = f.read().strip()
  report.write_report(
    out,
    sweep,
    recorded,
    table_command,
    setting=report.mechanism(module.__doc__),
    curves=False,
    changed=report.changes(module.__doc__),
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
