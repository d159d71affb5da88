#!/usr/bin/env python
"""Time our GRPO iteration on a benchmark workload: ``python scripts/bench.py --workload tiny``.

Prints one JSON line (``--json``) or a summary: iteration_s (median of the steady-state
iterations), generate_s, train_step_s, compile_s, peak_rss_mb, tokens_per_s, mfu (train-step
FLOPs over the jitted-matmul peak this run measures) and the number of compilations after the
warm-up (0 means no recompilation per step). Workloads: see posttrain_jax/sweeps/bench.py.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workload", default="tiny")
  parser.add_argument("--iters", type=int, default=10, help="timed iterations (after warm-up)")
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--max_new", type=int, default=None, help="completion length T")
  parser.add_argument("--group", type=int, default=8, help="rollouts per prompt G")
  parser.add_argument("--prompts", type=int, default=8)
  parser.add_argument("--preset", default=None, help="model preset instead of the workload's")
  parser.add_argument("--no_peak", action="store_true", help="skip the matmul-peak measurement")
  parser.add_argument("--cache_dir", default=os.path.join(os.path.dirname(
      os.path.dirname(os.path.abspath(__file__))), ".jax_cache"),
                      help="persistent compilation cache ('' to disable)")
  parser.add_argument("--async_queue", type=int, default=0,
                      help="> 0: asynchronous rollouts with a queue of this many batches")
  parser.add_argument("--max_staleness", type=int, default=2,
                      help="asynchronous rollouts: drop batches more versions old than this")
  parser.add_argument("--json", action="store_true")
  args = parser.parse_args()
  import jax
  if args.cache_dir:
    jax.config.update("jax_compilation_cache_dir", args.cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  from posttrain_jax.sweeps import bench
  try:
    record = bench.run(args.workload, iters=args.iters, warmup=args.warmup,
                       max_new=args.max_new, group=args.group, prompts=args.prompts,
                       preset=args.preset, measure_peak=not args.no_peak,
                       async_rollouts=({"queue_size": args.async_queue,
                                        "max_staleness": args.max_staleness}
                                       if args.async_queue else None))
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(json.dumps(record) if args.json else bench.summary_line(record))
  return 0


if __name__ == "__main__":
  sys.exit(main())
