#!/usr/bin/env python
"""The repair-window measurement of a review reproduction, pooled over seeds, per arm.

    python scripts/repair_curve.py results/review        # writes results/review/repair_curve.md

Reads every ``runs/seed*/ARM/rl/review_events.jsonl`` (the visit events a review scheduler logs,
scheduling/review.py) and writes, per arm, the restoration cost against the review delay: for a
correct visit followed by a next visit ``d`` steps later, how often the prompt had regressed by
then, and for the regressed ones that were restored, the visits, steps and rollouts it took
(``review.restoration_episodes`` / ``review.repair_curve``; episodes of all seeds pooled).
"""

import argparse
import glob
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("results_dir", help="a reproduction's results folder (with runs/)")
  parser.add_argument("--out", default=None, help="default RESULTS_DIR/repair_curve.md")
  args = parser.parse_args()
  from posttrain_jax import io as ptio
  from posttrain_jax import scheduling
  from posttrain_jax.train import eval_stage, rl

  paths = sorted(
    glob.glob(
      os.path.join(args.results_dir, "runs", "seed*", "*", "rl", rl.REVIEW_EVENTS + ".jsonl")
    )
  )
  if not paths:
    print(
      f"error: no {rl.REVIEW_EVENTS}.jsonl under {args.results_dir}/runs/seed*/*/rl/",
      file=sys.stderr,
    )
    return 2
  by_arm: dict[str, list] = {}
  for path in paths:
    seed_dir, arm = path.split(os.sep)[-4], path.split(os.sep)[-3]
    events = ptio.read_jsonl(path)
    for e in events:  # uids are per seed: keep seeds apart when pooling
      e["uid"] = f"{seed_dir}/{e['uid']}"
    by_arm.setdefault(arm, []).extend(events)
  edges = eval_stage.REPAIR_EDGES
  header = [
    "arm",
    "review delay (steps)",
    "episodes",
    "regression rate",
    "restored",
    "mean visits to restore",
    "mean steps",
    "mean rollouts",
  ]
  rows = []
  for arm, events in by_arm.items():
    for r in scheduling.repair_curve(scheduling.restoration_episodes(events), edges):
      if r["episodes"]:
        hi = r["d_hi"] if r["d_hi"] < edges[-1] else "inf"
        rows.append(
          [
            arm,
            f"[{r['d_lo']}, {hi})",
            r["episodes"],
            r["regression_rate"],
            r["restored"],
            r["mean_visits"],
            r["mean_steps"],
            r["mean_rollouts"],
          ]
        )
  seeds = sorted({p.split(os.sep)[-4] for p in paths})
  out = args.out or os.path.join(args.results_dir, "repair_curve.md")
  text = ptio.write_report(
    out,
    "Repair window: restoration cost against review delay",
    [
      f"Episodes pooled over {len(seeds)} seeds ({', '.join(seeds)}). An episode starts at a "
      "correct visit of a prompt; its delay is the steps to the prompt's next visit; it "
      "regressed if that visit was wrong, and the restoration cost counts the visits, steps "
      "and rollouts until the next correct visit (scheduling/review.py).",
      ptio.format_table(header, rows),
    ],
    f"python scripts/repair_curve.py {args.results_dir}",
  )
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
