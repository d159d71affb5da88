"""The last-mention shortcut scored on the problems a ToM reproduction was evaluated on, beside
the runs' accuracies.

    python scripts/tom_shortcut.py                      # results/tom, experiments/tom.py
    python scripts/tom_shortcut.py results/tom experiments/tom.py --out results/tom/shortcut.md

The heuristic (``envs.tom.last_mentioned``: answer the last box the story names) needs no model;
it is scored on exactly the eval sets of the config (``train.context.eval_sets``). Per arm the
table gives each set's mean accuracy over seeds, before and after RL, and how many runs scored
exactly what the heuristic scores on every set (a run that answers like the shortcut does).
"""

import argparse
import os
import sys


def metric(name: str, when: str) -> str:
  """The eval stage's summary key of an eval set (``train``, ``heldout`` or an extra env)."""
  middle = {"train": "", "heldout": "_heldout"}.get(name, f"_{name}")
  return f"accuracy{middle}_{when}_rl"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("results_dir", nargs="?", default="results/tom")
  parser.add_argument("config", nargs="?", default="experiments/tom.py")
  parser.add_argument("--out", default=None, help="default RESULTS_DIR/shortcut.md")
  args = parser.parse_args(argv)
  from posttrain_jax import io as ptio
  from posttrain_jax.envs import tom
  from posttrain_jax.sweeps import runner
  from posttrain_jax.train import context

  runs_path = os.path.join(args.results_dir, "runs.jsonl")
  if not os.path.exists(runs_path):
    print(f"error: no {runs_path}; run scripts/reproduce.py {args.config} first", file=sys.stderr)
    return 2
  module = runner.load_config_module(args.config)
  arms = module.get_config().sweep.arms
  sets, built = {}, {}
  for arm in arms:  # arms may train on different envs: each arm's own eval sets
    c = module.get_config(f"arm={arm}")
    key = (c.env.name, c.env.level, c.eval.to_json())
    if key not in built:  # arms with the same env and eval settings share them
      built[key] = context.eval_sets(c)
    for name, (_, problems) in built[key].items():
      sets.setdefault(name, {})[arm] = problems
  shortcut = {}
  for name, by_arm in sets.items():
    accs = {
      arm: sum(tom.last_mentioned(p.prompt) == p.answer for p in ps) / len(ps)
      for arm, ps in by_arm.items()
    }
    shortcut[name] = accs
  runs = ptio.read_jsonl(runs_path)
  names = list(sets)
  header = (
    ["arm", "runs"]
    + [f"{n}: shortcut" for n in names]
    + [f"{n}: {w} RL" for n in names for w in ("before", "after")]
    + ["runs scoring as the shortcut (before RL)", "(after RL)"]
  )
  rows = []
  for arm in arms:
    mine = [r for r in runs if r["arm"] == arm]
    if not mine:
      continue
    tol = 0.5 / len(sets["train"][arm])
    same = {
      w: sum(all(abs(r[metric(n, w)] - shortcut[n][arm]) < tol for n in names) for r in mine)
      for w in ("before", "after")
    }
    rows.append(
      [arm, len(mine)]
      + [shortcut[n][arm] for n in names]
      + [sum(r[metric(n, w)] for r in mine) / len(mine) for n in names for w in ("before", "after")]
      + [same["before"], same["after"]]
    )
  out = args.out or os.path.join(args.results_dir, "shortcut.md")
  text = ptio.write_report(
    out,
    "The last-mention shortcut on the eval sets",
    [
      "shortcut: the accuracy of answering the last box the story names "
      "(envs.tom.last_mentioned) on the very problems each set holds; the other columns are "
      f"the runs' greedy accuracies (mean over seeds, from {runs_path}). A run scores as the "
      "shortcut when its accuracy equals the heuristic's on every set.",
      ptio.format_table(header, rows),
    ],
    f"python scripts/tom_shortcut.py {args.results_dir} {args.config}",
  )
  print(text)
  return 0
