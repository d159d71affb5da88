#!/usr/bin/env python
"""Run a pilot: one seed of a reproduction config in a trial setting, before its table.

    python scripts/pilot.py experiments/echorl.py --name level2 --label "level 2" \
        --arms grpo,echorl -- --config.env.level=2 --config.rl.temperature=0.7

Writes results/NAME/pilots/PILOT_seedS.json and re-renders pilots.md beside it from every pilot
there (posttrain_jax/sweeps/pilot.py; docs/experiments.md, "Pilots"). A change to the config
after a pilot is noted in the config's docstring, as any change after seeing results.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from posttrain_jax.sweeps import pilot  # noqa: E402


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("config", help="experiments/NAME.py")
  parser.add_argument("--name", default=None, help="the pilot's file name (letters, digits, _-)")
  parser.add_argument("--label", default=None, help="its row label in pilots.md (default: name)")
  parser.add_argument("--arms", default=None, help="comma-separated arms (default: all)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--workers", type=int, default=None, help="as in scripts/reproduce.py")
  parser.add_argument("--out", default=None, help="folder (default results/NAME/pilots)")
  parser.add_argument(
    "--render-only", action="store_true", help="rewrite pilots.md from the JSON files; run nothing"
  )
  argv = sys.argv[1:]
  cut = argv.index("--") if "--" in argv else len(argv)
  args = parser.parse_args(argv[:cut])
  args.overrides = argv[cut + 1 :]  # after --: --config.KEY=VALUE ...
  try:
    if args.render_only:
      name = os.path.splitext(os.path.basename(args.config))[0]
      out = args.out or os.path.join("results", name, "pilots")
      sweep = pilot.sweep_of(pilot.load_config_module(args.config))
      text = pilot.render(out, args.config, sweep)
    elif not args.name:
      parser.error("--name is required to run a pilot")
    else:
      text = pilot.run_pilot(
        args.config,
        args.name,
        args.label or args.name,
        overrides=tuple(args.overrides),
        arms=args.arms.split(",") if args.arms else None,
        seed=args.seed,
        workers=args.workers,
        out_dir=args.out,
      )
  except (ValueError, RuntimeError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
