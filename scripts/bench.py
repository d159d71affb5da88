#!/usr/bin/env python
"""Time our GRPO iteration on a benchmark workload: ``python scripts/bench.py --workload tiny``.

Prints one JSON line (``--json``) or a summary: iteration_s (median of the steady-state
iterations), generate_s, train_step_s, compile_s, peak_rss_mb, tokens_per_s, mfu (train-step
FLOPs over the jitted-matmul peak this run measures) and the number of compilations after the
warm-up (0 means no recompilation per step). Workloads: see posttrain_jax/bench/speed.py.

``--workload time_to_target`` (posttrain_jax/bench/time_to_target.py) instead times GRPO from
the quickstart's pretrained checkpoint until held-out greedy accuracy reaches 60% (and 80%,
90%), per seed (``--seeds``); the checkpoint and its problems are built once under
``--ttt_dir`` (pretraining a few minutes, or exported from ``--ttt_source RUN_WORKDIR``), for TRL's
run of the same race (scripts/peers/trl_time_to_target.py).
"""

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


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
  parser.add_argument(
    "--cache_dir",
    default=os.path.expanduser("~/.cache/posttrain_jax/xla"),
    help="persistent compilation cache ('' to disable)",
  )
  parser.add_argument(
    "--async_queue",
    type=int,
    default=0,
    help="> 0: asynchronous rollouts with a queue of this many batches",
  )
  parser.add_argument(
    "--max_staleness",
    type=int,
    default=2,
    help="asynchronous rollouts: drop batches more versions old than this",
  )
  parser.add_argument("--seeds", default="0,1,2", help="time_to_target: RL seeds")
  parser.add_argument(
    "--ttt_dir",
    default=os.path.join(REPO, ".cache", "time_to_target"),
    help="time_to_target: where the checkpoint and problems are kept",
  )
  parser.add_argument(
    "--ttt_source",
    default=None,
    help="time_to_target: a run workdir whose pretrain stage to export instead of pretraining",
  )
  parser.add_argument("--eval_every", type=int, default=5, help="time_to_target")
  parser.add_argument("--max_steps", type=int, default=300, help="time_to_target")
  parser.add_argument(
    "--no_trim",
    action="store_true",
    help="config.rl.trim_completions=False: the update over the whole "
    "max_new_tokens budget (the forced-length workloads never trim)",
  )
  parser.add_argument(
    "--no_shared_prefix",
    action="store_true",
    help="config.rl.shared_prefix=False: the trainer's per-row forward",
  )
  parser.add_argument(
    "--sampler_devices",
    type=int,
    default=None,
    help="XLA:CPU devices the sampler's rows are split over, the trainer on "
    "the first (default: the workload's; 0: one shared device)",
  )
  parser.add_argument(
    "--dtype", default=None, help="the model's compute dtype (default float32, as the peers run)"
  )
  parser.add_argument("--json", action="store_true")
  args = parser.parse_args()
  import jax

  if not args.cache_dir:  # nor the cache a run would enable (parallel/compile_cache.py)
    os.environ["POSTTRAIN_JAX_COMPILATION_CACHE"] = ""
  if args.cache_dir:
    jax.config.update("jax_compilation_cache_dir", args.cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  from posttrain_jax.bench import speed as bench
  from posttrain_jax.bench import time_to_target as _  # noqa: F401  (imported before freezing)
  from posttrain_jax.parallel import host

  host.freeze_imports()  # as posttrain_jax.main does
  if args.workload == "time_to_target":
    return time_to_target(args)
  try:
    record = bench.run(
      args.workload,
      iters=args.iters,
      warmup=args.warmup,
      max_new=args.max_new,
      group=args.group,
      prompts=args.prompts,
      preset=args.preset,
      measure_peak=not args.no_peak,
      async_rollouts=(
        {"queue_size": args.async_queue, "max_staleness": args.max_staleness}
        if args.async_queue
        else None
      ),
      shared_prefix=not args.no_shared_prefix,
      sampler_devices=args.sampler_devices,
      dtype=args.dtype,
    )
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(json.dumps(record) if args.json else bench.summary_line(record))
  return 0


def time_to_target(args) -> int:
  from posttrain_jax.bench import time_to_target as ttt

  try:
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    hf_dir = ttt.prepare(args.ttt_dir, source=args.ttt_source)
    records = [
      ttt.run_ours(
        hf_dir,
        seed,
        eval_every=args.eval_every,
        max_steps=args.max_steps,
        max_new=args.max_new,
        trim=not args.no_trim,
      )
      for seed in seeds
    ]
  except (ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  out = {
    "workload": "time_to_target",
    "checkpoint": hf_dir,
    "problems": os.path.join(args.ttt_dir, ttt.PROBLEMS_FILE),
    "records": records,
    **ttt.summarize(records),
  }
  if args.json:
    print(json.dumps(out))
  else:
    for r in records:
      print(
        f"seed {r['seed']}: start {r['start_accuracy']:.3f}, reached {r['reached']}, "
        f"{r['iteration_s']:.3f} s per step, first step {r['first_iteration_s']:.1f} s"
      )
    print(f"median seconds to {ttt.TARGET:g}: {out['median_seconds_to_target']}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
