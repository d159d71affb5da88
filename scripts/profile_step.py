#!/usr/bin/env python
"""Per-op profile of one stage of a benchmark workload: ``python scripts/profile_step.py``.

    python scripts/profile_step.py --workload small --stage sample     # the sampler (decode)
    python scripts/profile_step.py --workload small --stage update     # the optimiser update

Builds the workload as scripts/bench.py does (posttrain_jax/bench/speed.py; the sampler with
forced length), compiles and warms the stage, then profiles one call with XLA:CPU's per-thunk
events and prints the time per (op, output shape, JAX op) group, largest first
(posttrain_jax/bench/profile.py says how to read it). ``--json`` prints the rows instead.
"""

import argparse
import json
import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
STAGES = {"sample": "generate", "update": "constrained"}  # stage -> its jitted function's name


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workload", default="small")
  parser.add_argument("--stage", default="sample", choices=sorted(STAGES))
  parser.add_argument("--max_new", type=int, default=None, help="completion length T")
  parser.add_argument("--group", type=int, default=8)
  parser.add_argument("--prompts", type=int, default=8)
  parser.add_argument("--preset", default=None)
  parser.add_argument("--top", type=int, default=25)
  parser.add_argument("--out", default=None, help="keep the trace and HLO dump here")
  parser.add_argument("--json", action="store_true")
  args = parser.parse_args()
  out = args.out or tempfile.mkdtemp(prefix="profile_step_")
  dump, trace = os.path.join(out, "hlo"), os.path.join(out, "trace")
  os.environ["XLA_FLAGS"] = " ".join(
    filter(
      None,
      [
        os.environ.get("XLA_FLAGS", ""),
        "--xla_cpu_enable_xprof_traceme=true",
        f"--xla_dump_to={dump}",
        "--xla_dump_hlo_as_text",
      ],
    )
  )
  os.environ["POSTTRAIN_JAX_COMPILATION_CACHE"] = ""  # compile here, so the dump is written

  import jax

  from posttrain_jax.bench import profile
  from posttrain_jax.bench import speed as bench
  from posttrain_jax.train import context as context_lib
  from posttrain_jax.train import generation
  from posttrain_jax.train import rl_step as step_lib

  try:
    config = bench.bench_config(
      args.workload,
      max_new=args.max_new,
      group=args.group,
      prompts=args.prompts,
      preset=args.preset,
    )
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  context_lib.apply_cpu_devices(config)
  ctx, run_state, rl_run, _ = bench.rl_setup(config, os.path.join(out, "run"))
  cfg, key = config.rl, jax.random.key(0)
  if args.stage == "sample":
    sample = bench.forced_sampler(ctx, rl_run)
    tokens, mask = bench.encoded_prompts(ctx, cfg, key)
    weights = rl_run.host.weights(rl_run.fns.full(run_state["policy"].params), -1)
    call = lambda: sample(weights, tokens, mask, key)
  else:
    gen = generation.generate(ctx, rl_run, run_state["policy"].params, 0, key)
    batch, _ = step_lib.train_batch(ctx, rl_run, run_state, None, gen, key)
    state = [run_state["policy"]]

    def call():
      state[0], metrics = rl_run.fns.update(state[0], batch, run_state["controls"], key)
      return metrics

  jax.block_until_ready(call())  # compiles
  jax.block_until_ready(call())  # warm
  jax.profiler.start_trace(trace, create_perfetto_trace=True)
  t = time.perf_counter()
  jax.block_until_ready(call())
  wall = time.perf_counter() - t
  jax.profiler.stop_trace()
  durations, calls = profile.thunk_events(trace)
  ops = profile.parse_hlo(open(profile.find_module(dump, STAGES[args.stage])).read())
  rows = profile.group(durations, calls, ops)
  if args.json:
    print(
      json.dumps({"workload": args.workload, "stage": args.stage, "wall_s": wall, "rows": rows})
    )
  else:
    print(f"{args.workload} {args.stage}: one call {wall:.3f} s (profiled); thunk time by op:")
    print(profile.format_rows(rows, args.top))
    print(f"(trace and HLO dump under {out})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
