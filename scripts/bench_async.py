#!/usr/bin/env python
"""Asynchronous against synchronous rollouts, side by side: ``python scripts/bench_async.py``.

Alternates ``--runs`` synchronous and asynchronous runs of one workload (posttrain_jax/sweeps/
bench.py; the same RL iteration, the async one with a producer thread generating while the
trainer updates, train/async_rollouts.py) in one process and writes ``results/async_rollouts.md``
(+ ``.json``): per-run medians of the iteration time, rollouts per second, the ratio and the
mean staleness of the batches the trainer used.
"""

import argparse
import json
import os
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workload", default="tiny")
  parser.add_argument("--runs", type=int, default=3)
  parser.add_argument("--iters", type=int, default=10)
  parser.add_argument("--max_new", type=int, default=None)
  parser.add_argument("--queue_size", type=int, default=1)
  parser.add_argument("--max_staleness", type=int, default=2)
  parser.add_argument("--out", default=os.path.join(REPO, "results", "async_rollouts.md"))
  args = parser.parse_args()
  import jax

  jax.config.update("jax_compilation_cache_dir", os.path.expanduser("~/.cache/posttrain_jax/xla"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  from posttrain_jax.bench import speed as bench

  settings = {"queue_size": args.queue_size, "max_staleness": args.max_staleness}
  records = {"sync": [], "async": []}
  for i in range(args.runs):
    for mode in ("sync", "async"):
      r = bench.run(
        args.workload,
        iters=args.iters,
        max_new=args.max_new,
        seed=i,
        measure_peak=False,
        async_rollouts=settings if mode == "async" else None,
      )
      records[mode].append(r)
      print(
        f"run {i} {mode}: {r['iteration_s']:.3f} s/iteration, staleness {r['staleness_mean']:.2f}",
        flush=True,
      )
  med = {m: statistics.median(r["iteration_s"] for r in rs) for m, rs in records.items()}
  rows = records["sync"][0]["prompts"] * records["sync"][0]["group"]
  command = " ".join(
    [
      "python scripts/bench_async.py",
      f"--workload {args.workload}",
      f"--runs {args.runs}",
      f"--iters {args.iters}",
      f"--queue_size {args.queue_size}",
      f"--max_staleness {args.max_staleness}",
    ]
    + ([f"--max_new {args.max_new}"] if args.max_new else [])
  )
  lines = [
    f"# Asynchronous vs synchronous rollouts ({args.workload} workload)",
    "",
    f"{args.runs} alternating runs each of {args.iters} timed iterations (after 2 warm-up), "
    f"{rows} rollouts of {records['sync'][0]['max_new']} forced tokens per iteration, "
    f"{jax.device_count()} {jax.default_backend()} device(s), {os.cpu_count()} cores. Async: "
    f"queue of {args.queue_size} batch(es), batches more than {args.max_staleness} versions "
    "behind the trainer dropped.",
    "",
    "| mode | s/iteration (median of run medians) | min | max | rollouts/s | mean staleness |",
    "|---|---|---|---|---|---|",
  ]
  for mode, rs in records.items():
    its = [r["iteration_s"] for r in rs]
    lines.append(
      f"| {mode} | {med[mode]:.3f} | {min(its):.3f} | {max(its):.3f} | "
      f"{rows / med[mode]:.0f} | "
      f"{statistics.mean(r['staleness_mean'] for r in rs):.2f} |"
    )
  lines += [
    "",
    f"Throughput async / sync: **{med['sync'] / med['async']:.2f}x**.",
    "",
    f"Command: `{command}`",
    "",
  ]
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
  with open(os.path.splitext(args.out)[0] + ".json", "w", encoding="utf-8") as f:
    json.dump(records, f, indent=1)
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  sys.exit(main())
