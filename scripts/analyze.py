#!/usr/bin/env python
"""Runs a named analysis on a finished run's checkpoints and writes a table beside them.

    python scripts/analyze.py plasticity WORKDIR --stages pretrain sft rl [--rho 0.05]
        [--examples 256] [--source env|FILE.jsonl] [--against OTHER_WORKDIR --stage rl
        --base-stage pretrain --fraction 0.05]
    python scripts/analyze.py domains WORKDIR --stages pretrain rl_a rl_b --domains ENV_A ENV_B
    python scripts/analyze.py representations WORKDIR --stages pretrain rl [--examples 256]
    python scripts/analyze.py collect OUT.md RESULT.json [RESULT.json ...] [--title TITLE]

``plasticity`` (posttrain_jax/sweeps/analyze.py): per stage, the loss on gold rows, mean
max-prob and entropy (over-confidence), SAM-style sharpness and the gradient's cosine with the
first stage's; with ``--against``, the overlap of the two runs' top-changed MLP neurons. Writes
``WORKDIR/analysis/plasticity.md`` and ``.json``. ``domains``: every domain's accuracy and
gold-row NLL after every stage, and each stage's damage to each domain predicted to second order
beside the measured change (``WORKDIR/analysis/domains.md``). ``representations`` (posttrain_jax/sweeps/inside.py): per
stage and layer, at the last prompt token of the evaluation problems, the logit lens's agreement
with the first emitted token, linear CKA with the first stage, and a difference-of-means
correctness probe's held-out AUROC (``WORKDIR/analysis/representations.{md,json,png}``).
``collect``: one table over
several runs' result files of one analysis (e.g. one per seed of a reproduction), each cell the
mean and the runs' values.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from posttrain_jax.sweeps import analyze  # noqa: E402


def _collect(argv) -> int:
  parser = argparse.ArgumentParser(description="one table over several runs' results")
  parser.add_argument("out")
  parser.add_argument("results", nargs="+")
  parser.add_argument("--title", default="Analysis over runs")
  args = parser.parse_args(argv)
  try:
    text = analyze.collect(args.results, args.title)
  except (FileNotFoundError, ValueError, KeyError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  with open(args.out, "w", encoding="utf-8") as f:
    f.write(text)
  print(text, end="")
  return 0


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  if argv[:1] == ["collect"]:
    return _collect(argv[1:])
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("analysis", choices=sorted(analyze.ANALYSES))
  parser.add_argument("workdir")
  parser.add_argument("--stages", nargs="+", required=True, help="stages whose final params")
  parser.add_argument("--rho", type=float, default=0.05)
  parser.add_argument("--examples", type=int, default=256)
  parser.add_argument("--source", default="env")
  parser.add_argument("--against", default=None, help="another run's workdir (neuron overlap)")
  parser.add_argument("--stage", default=None, help="the stage compared with --against")
  parser.add_argument("--base-stage", default="pretrain")
  parser.add_argument("--fraction", type=float, default=0.05)
  parser.add_argument("--domains", nargs="+", default=(), help="env names (domains)")
  args = parser.parse_args(argv)
  extra = {"domains": args.domains} if args.analysis == "domains" else {}
  try:
    result = analyze.ANALYSES[args.analysis](
      args.workdir,
      args.stages,
      **extra,
      rho=args.rho,
      examples=args.examples,
      source=args.source,
      against=args.against,
      base_stage=args.base_stage,
      stage=args.stage,
      fraction=args.fraction,
    )
  except (FileNotFoundError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(analyze.render(args.analysis, result), end="")
  return 0


if __name__ == "__main__":
  sys.exit(main())
