#!/usr/bin/env python
"""Search hyperparameters: ``python scripts/hpo.py experiments/NAME.py --trials 20``.

Runs an Optuna study over the config's ``hpo`` section (search space, fidelity rungs, pruning,
early-stop rules; sweeps/hpo.py), each trial a run of the config with the trial's values. The
study is in OUT/study.db: rerun the same command after a stop or a kill to resume it. At the
end OUT holds trials.md (every trial), summary.json (the best configuration), history.png
and importance.png.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from posttrain_jax.sweeps import hpo, runner  # noqa: E402


def _space(text: str) -> dict:
  """``--space``: a JSON file, or JSON itself, of the same shape as ``hpo.space``."""
  try:
    if os.path.exists(text):
      with open(text, encoding="utf-8") as f:
        return json.load(f)
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"--space {text!r} is neither a JSON file nor JSON: {e}") from None


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("config", help="experiments/NAME.py (its get_config and hpo section)")
  parser.add_argument("--arg", default="", help="the config's argument (e.g. arm=grpo,seed=0)")
  parser.add_argument(
    "--space", default=None, help="search space: JSON or a JSON file (default: config.hpo.space)"
  )
  parser.add_argument("--trials", type=int, default=None, help="finished trials to stop at")
  parser.add_argument(
    "--budget", type=float, default=None, help="CPU-seconds of trial runs to stop at"
  )
  parser.add_argument("--sampler", choices=("tpe", "random"), default=None)
  parser.add_argument("--seed", type=int, default=None, help="the samplers' seed")
  parser.add_argument("--out", default=None, help="study folder (default runs/hpo/NAME)")
  parser.add_argument("--backend", choices=("local", "ray"), default="local")
  parser.add_argument(
    "--workers",
    type=int,
    default=0,
    help="local backend: 0 runs trials in this process (default), 1 in a subprocess each",
  )
  parser.add_argument(
    "--ray-address", default=None, help="with --backend ray: the cluster's address"
  )
  args = parser.parse_args()
  try:
    config = runner.load_config_module(args.config).get_config(args.arg or None)
    settings = hpo.settings_of(config)
    for key, value in (
      ("space", None if args.space is None else _space(args.space)),
      ("trials", args.trials),
      ("budget_s", args.budget),
      ("sampler", args.sampler),
      ("seed", args.seed),
    ):
      if value is not None:
        settings[key] = value
    hpo.flat_space(settings["space"])
    if not settings["space"]:
      raise ValueError(f"{args.config} declares no hpo.space; pass --space")
    name = os.path.splitext(os.path.basename(args.config))[0]
    study = hpo.Study(
      args.config,
      args.arg,
      settings,
      args.out or os.path.join("runs", "hpo", name),
      runner.make_backend(args.backend, workers=args.workers, address=args.ray_address),
      seed=int(config.seed),
    )
    summary = hpo.run_study(study)
  except (FileNotFoundError, ValueError, RuntimeError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(json.dumps({k: summary[k] for k in ("best_value", "best_params", "trials", "cpu_s")}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
