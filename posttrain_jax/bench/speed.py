"""Speed of our GRPO iteration on the peers' benchmark workloads (issue 5; scripts/bench.py).

Workloads (the same shapes as scripts/peers/):

    tiny     hidden 128, 4 layers, 4 heads / 2 KV heads, MLP 512, tied (our ``tiny`` preset),
             8 prompts x 8 rollouts, 16 new tokens forced (EOS never stops a row), beta 0, fp32
    small    hidden 512, 8 layers, 8 heads / 4 KV heads, MLP 2048 (our ``base`` preset),
             8 x 8 rollouts, 128 new tokens
    tiny_kl  tiny with a k3 KL term to the frozen reference (beta 0.04)

One iteration is everything the RL loop does per step (sample, score on the host, reference
and trainer log-probs, advantages, one optimiser update, controllers), timed end to end with
the loop's own code (``train.rl.rl_iteration``). Compilations are counted with JAX's monitoring
events, so a steady state that recompiles shows up as ``steady_compiles > 0``.
"""

import dataclasses
import resource
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from posttrain_jax import defaults, parallel, rollout
from posttrain_jax import methods as methods_lib
from posttrain_jax.train import async_rollouts as async_lib
from posttrain_jax.train import context as context_lib
from posttrain_jax.train import generation, hooks
from posttrain_jax.train import rl as rl_lib
from posttrain_jax.train import rl_step as step_lib
from posttrain_jax.train import state as state_lib

# sampler_devices: XLA:CPU devices the sampler's rows are split over (config.cpu_devices,
# config.sampler_mesh), the trainer on the first; 0: both share one device. A tiny model's
# decode matmuls (64 rows x 128) are too small for two threads to share one, so two devices
# decoding half the rows each, a thread apiece, are faster (sampler 33 -> 22 ms); the small
# model's (x 512 / 2048) already keep both threads busy and slow down split (4.8 -> 6.4 s).
WORKLOADS = {
  "tiny": dict(preset="tiny", max_new=16, beta=0.0, sampler_devices=2),
  "small": dict(preset="base", max_new=128, beta=0.0, sampler_devices=0),
  "tiny_kl": dict(preset="tiny", max_new=16, beta=0.04, sampler_devices=2),
}

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
# Every stage of turning a Python function into an executable: tracing to a jaxpr, lowering to
# StableHLO, and the backend compile (or its load from the persistent cache).
_STAGE_EVENTS = (
  "/jax/core/compile/jaxpr_trace_duration",
  "/jax/core/compile/jaxpr_to_mlir_module_duration",
  _COMPILE_EVENT,
)


class CompileCounter:
  """Counts XLA backend compilations (and their seconds) while registered; ``total_seconds``
  adds tracing and lowering."""

  def __init__(self):
    self.count, self.seconds, self.total_seconds = 0, 0.0, 0.0
    jax.monitoring.register_event_duration_secs_listener(self._listen)

  def _listen(self, event: str, duration: float, **_):
    if event == _COMPILE_EVENT:
      self.count += 1
      self.seconds += duration
    if event in _STAGE_EVENTS:
      self.total_seconds += duration


def bench_config(
  workload: str,
  *,
  max_new: int | None = None,
  group: int = 8,
  prompts: int = 8,
  preset: str | None = None,
  sampler_devices: int | None = None,
  dtype: str | None = None,
):
  """The RL config of ``workload`` (``max_new``/``group``/``preset`` override its shape,
  ``sampler_devices`` its device layout, ``dtype`` the model's compute dtype, float32 as
  the peers run by default)."""
  if workload not in WORKLOADS:
    raise ValueError(f"unknown workload {workload!r}; valid: {', '.join(WORKLOADS)}")
  w = WORKLOADS[workload]
  c = defaults.base_config()
  n = w["sampler_devices"] if sampler_devices is None else int(sampler_devices)
  if n < 0:
    raise ValueError(f"sampler_devices must be >= 0, got {n}")
  if n:  # the trainer on CPU device 0, the sampler's rows over devices 0..n-1. (Disjoint
    # devices, trainer on 0 and sampler on 1..n, need n + 1 devices, which on this 2-core
    # machine slowed both stages: sampler 23 -> 33 ms, train step 60 -> 66 ms.)
    c.cpu_devices = n
    c.mesh.update(shape=(1, 1, 1), devices=(0,))
    c.sampler_mesh.shape = (n, 1, 1)
  c.stages = ("rl",)
  c.progress = c.tensorboard = False
  c.env.name, c.env.level = "arithmetic", 3
  c.model.preset = preset or w["preset"]
  if dtype:
    c.model.dtype = dtype
  c.model.max_seq_len = 16 + (max_new or w["max_new"]) + 8
  c.rl.update(
    prompts_per_step=prompts,
    group_size=group,
    max_new_tokens=max_new or w["max_new"],
    lr=1e-4,
    b2=0.99,
    grad_clip=1.0,
    kl_coef=w["beta"],
    kl_estimator="k3",
    eval_every=0,
    temperature=1.0,
  )
  return c


def matmul_peak_gflops(n: int = 2048, repeats: int = 10) -> float:
  """Median GFLOP/s of a jitted float32 ``n x n`` matmul: the machine's dense-matmul peak."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  f = jax.jit(lambda x, y: x @ y)
  f(a, a).block_until_ready()
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    f(a, a).block_until_ready()
    times.append(time.perf_counter() - t)
  return 2 * n**3 / statistics.median(times) / 1e9


def train_flops(
  num_params: int, rows: int, seq: int, cfg, *, prompt_len: int = 0, group: int = 0
) -> float:
  """Forward + backward FLOPs of one update: 6 N per token plus causal attention
  (6 · 2 · rows · seq² · H · hd / 2 per layer, forward and backward).

  ``group`` > 1 (the shared-prompt forward, ``train.rl.shared_prefix_group``): the FLOPs it
  executes, the ``prompt_len`` prompt positions once per ``group`` rows: 6 N per token over
  ``rows/group · S + rows · (seq - S)`` tokens, attention ``S²/2`` per prompt plus
  ``(seq-S) · (S + (seq-S)/2)`` per row.
  """
  per_pair = 6 * 2 * cfg.num_heads * cfg.head_dim * cfg.num_layers  # per (query, key) pair
  if group > 1:
    S, T = prompt_len, seq - prompt_len
    prompts = rows // group
    tokens = prompts * S + rows * T
    pairs = prompts * S * S / 2 + rows * T * (S + T / 2)
    return 6.0 * num_params * tokens + per_pair * pairs
  return 6.0 * num_params * rows * seq + per_pair * rows * seq * seq / 2


def generation_flops(num_params: int, rows: int, prompt_len: int, max_new: int, cfg) -> float:
  """Forward FLOPs of sampling ``max_new`` tokens after a ``prompt_len`` prompt for ``rows``
  rows, each row computed on its own (the peers' accounting): 2 N per fed position (the
  prompt, then every sampled token but the last) plus causal attention, 2 · 2 · H · hd per
  (query, key) pair and layer (scores and values)."""
  per_pair = 2 * 2 * cfg.num_heads * cfg.head_dim * cfg.num_layers
  fed = prompt_len + max_new - 1
  return rows * (2.0 * num_params * fed + per_pair * fed * (fed + 1) / 2)


def rl_setup(config, workdir: str):
  """``(ctx, run_state, rl_run, init_params)``: what the RL loop (``train.rl.run``) builds
  before its first iteration, without checkpoints, metric writers or a reference copy. Like
  ``posttrain_jax.main`` it first installs the run's store of compiled programs
  (``context.executable_store``; none when the config, environment or test session turns it
  off), replacing any an earlier setup of this process installed."""
  parallel.executables.install(context_lib.executable_store(config, workdir))
  ctx = methods_lib.make_context(config, workdir)
  tx = state_lib.make_optimizer(**state_lib.optimizer_kwargs(config.rl))
  init = ctx.placement.place(ctx.init_params)
  built = hooks.build_all(ctx, init)  # the active methods' objects and run-state slots
  slots = hooks.init_states(ctx, built, init)
  run_state = rl_lib.init_run_state(
    config.rl, init, tx, placement=ctx.placement, method_slots=slots
  )
  rl_run = rl_lib.build_run(ctx, tx, run_state=run_state, base=init, methods=built)
  return ctx, run_state, rl_run, init


def run(
  workload: str = "tiny",
  *,
  iters: int = 10,
  warmup: int = 2,
  max_new: int | None = None,
  group: int = 8,
  prompts: int = 8,
  preset: str | None = None,
  seed: int = 0,
  workdir: str | None = None,
  measure_peak: bool = True,
  async_rollouts: dict | None = None,
  shared_prefix: bool = True,
  sampler_devices: int | None = None,
  dtype: str | None = None,
) -> dict:
  """Runs ``warmup + iters`` iterations of ``workload`` and returns the timing record.
  ``async_rollouts`` (``{'queue_size', 'max_staleness'}``): generate in a producer thread
  (train/async_rollouts.py) while the trainer updates, as ``config.rl.async_rollouts`` does."""
  counter = CompileCounter()
  config = bench_config(
    workload,
    max_new=max_new,
    group=group,
    prompts=prompts,
    preset=preset,
    sampler_devices=sampler_devices,
    dtype=dtype,
  )
  context_lib.apply_cpu_devices(config)  # before anything starts JAX's backend
  config.seed = seed
  config.rl.shared_prefix = shared_prefix
  t_start = time.perf_counter()
  with tempfile.TemporaryDirectory() as tmp:
    ctx, run_state, rl_run, init = rl_setup(config, workdir or tmp)
    cfg = config.rl
    ref = jax.tree.map(jnp.copy, init) if rl_lib.needs_reference(config, ctx.methods) else None
    rl_run = dataclasses.replace(
      rl_run, fns=dataclasses.replace(rl_run.fns, sample=forced_sampler(ctx, rl_run))
    )
    key = jax.random.key(seed)
    setup_s = time.perf_counter() - t_start
    times, gen, train, compiles, stale = [], [], [], [], []
    producer = None
    if async_rollouts is not None:
      producer = async_lib.RolloutProducer(
        lambda params, version, n: generation.generate(
          ctx, rl_run, params, version, jax.random.fold_in(key, 1 << 20 | n), n
        ),
        **async_rollouts,
      )
      producer.publish(jax.tree.map(jnp.copy, run_state["policy"].params), 0)
      producer.start()
    try:
      for i in range(warmup + iters):
        before = counter.count
        t = time.perf_counter()
        run_state, record = step_lib.rl_step(
          ctx, rl_run, run_state, ref, jax.random.fold_in(key, i), producer=producer
        )
        jax.block_until_ready(run_state["policy"].params)
        times.append(time.perf_counter() - t)
        gen.append(record["time/generate_s"])
        train.append(record["time/train_s"])
        compiles.append(counter.count - before)
        stale.append(record.get("async/staleness", 0.0))
    finally:
      if producer is not None:
        producer.stop()
    sample_all = sample_only(
      ctx, rl_run, run_state, cfg, jax.random.fold_in(key, 1 << 21), max(iters, 5)
    )
    model_cfg = state_lib.model_config(config.model, len(ctx.tokenizer))
    num_params = model_cfg.num_params()
    rows, seq = cfg.prompts_per_step * cfg.group_size, ctx.prompt_len + cfg.max_new_tokens
  stored = parallel.executables.stats()
  steady = times[warmup:]
  iteration_s = statistics.median(steady)
  train_s = statistics.median(train[warmup:])
  generate_s = statistics.median(gen[warmup:])
  sample_s = statistics.median(sample_all)
  peak = matmul_peak_gflops() if measure_peak else float("nan")
  # MFU counts the FLOPs the step executes (the shared-prompt forward skips the repeated
  # prompt positions); mfu_full_forward the per-row forward's, the peers' accounting.
  flops = train_flops(
    num_params, rows, seq - 1, model_cfg, prompt_len=ctx.prompt_len, group=rl_run.layout.group
  )
  full_flops = train_flops(num_params, rows, seq - 1, model_cfg)
  decode_flops = 2.0 * num_params * rows * cfg.max_new_tokens
  # The iteration's work in the peers' per-row accounting (the same for every side): the
  # update's forward + backward and the generation's forwards, attention included. Its growth
  # over T or G against the time's shows what the O(T^2) attention contributes.
  work = full_flops + generation_flops(
    num_params, rows, ctx.prompt_len, cfg.max_new_tokens, model_cfg
  )
  return {
    "workload": workload,
    "preset": config.model.preset,
    "dtype": config.model.dtype,
    "prompts": prompts,
    "group": group,
    "max_new": cfg.max_new_tokens,
    "kl_coef": cfg.kl_coef,
    "params": num_params,
    "iters": iters,
    "iteration_s": iteration_s,
    "iteration_min_s": min(steady),
    "iteration_max_s": max(steady),
    "iteration_all_s": steady,
    "generate_s": generate_s,
    "sample_s": sample_s,
    "sample_all_s": sample_all,
    "train_step_s": train_s,
    "compile_s": sum(times[:warmup]) - warmup * iteration_s + setup_s,
    "compile_backend_s": counter.seconds,
    "compile_all_stages_s": counter.total_seconds,
    # Everything that turned functions into loaded executables: JAX's stages (tracing,
    # lowering, XLA or its cache) plus loading and storing whole programs (executables).
    "compilation_s": counter.total_seconds
    + (0.0 if stored is None else stored["load_s"] + stored["store_s"]),
    "compiles_warmup": sum(compiles[:warmup]),
    "steady_compiles": sum(compiles[warmup:]),
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "tokens_per_s": rows * cfg.max_new_tokens / iteration_s,
    "train_gflops": flops / train_s / 1e9,
    "decode_gflops": decode_flops / sample_s / 1e9,
    "matmul_peak_gflops": peak,
    "mfu": flops / train_s / 1e9 / peak,
    "mfu_full_forward": full_flops / train_s / 1e9 / peak,
    "shared_prefix_group": rl_run.layout.group,
    "devices": jax.device_count(),
    "backend": jax.default_backend(),
    "sampler_devices": (0 if ctx.sampler_mesh is None else ctx.sampler_mesh.size),
    "async": async_rollouts is not None,
    "staleness_mean": statistics.mean(stale[warmup:]),
    "rollouts_per_s": rows / iteration_s,
    "work_gflop": work / 1e9,
    # Stored compiled programs (parallel/executables.py): loaded / compiled / ... counts.
    "executables": stored,
    "last_metrics": {
      k: float(record[k]) for k in ("reward/mean", "loss/total", "train/grad_norm") if k in record
    },
  }


def forced_sampler(ctx, rl_run):
  """The run's sampler with an EOS id no token has, so every row decodes all T tokens (the
  peers' forced length)."""
  cfg = ctx.config.rl
  sampler_cfg = dataclasses.replace(
    ctx.sampler_config(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens),
    eos_id=-1,
    prefill_group=rl_run.layout.group,
  )
  return rollout.make_sampler(ctx.graphdef, sampler_cfg, mesh=ctx.rollout_mesh)


def encoded_prompts(ctx, cfg, key):
  """``(tokens, mask)``: ``prompts_per_step`` training prompts, each repeated to its
  ``group_size`` rows, encoded as the sampler takes them."""
  P, G = cfg.prompts_per_step, cfg.group_size
  problems = ctx.env.sample(key, P, level=ctx.config.env.level, split="train")
  return generation.local_problems(ctx, problems, P * G, np.repeat(np.arange(P), G))[1]


def sample_only(ctx, rl_run, run_state, cfg, key, repeats: int) -> list[float]:
  """Seconds of ``repeats`` sampler calls alone (encoded prompts in, rollouts out, nothing
  scored), as HF ``generate`` is timed: the generation-only figure. Same shapes as the
  iteration's, so nothing compiles."""
  tokens, mask = encoded_prompts(ctx, cfg, key)
  weights = rl_run.host.weights(rl_run.fns.full(run_state["policy"].params), -1)
  times = []
  for i in range(repeats + 1):  # the first call (a new weight copy's first use) is dropped
    t = time.perf_counter()
    jax.block_until_ready(rl_run.fns.sample(weights, tokens, mask, jax.random.fold_in(key, i)))
    times.append(time.perf_counter() - t)
  return times[1:]


def summary_line(r: dict) -> str:
  return (
    f"{r['workload']}: iteration {r['iteration_s']:.3f} s (min {r['iteration_min_s']:.3f}, "
    f"max {r['iteration_max_s']:.3f}), generate {r['generate_s']:.3f} s (sampler alone "
    f"{r['sample_s']:.3f} s), train step "
    f"{r['train_step_s']:.3f} s, compile {r['compile_s']:.1f} s (tracing, lowering, "
    f"XLA and stored programs {r['compilation_s']:.1f} s), MFU {r['mfu']:.0%} of "
    f"{r['matmul_peak_gflops']:.0f} GFLOP/s, steady-state compiles {r['steady_compiles']}"
  )
