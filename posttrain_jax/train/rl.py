"""The RL stage: P prompts x G rollouts, rewards, advantages, jitted updates (DESIGN.md section 3).

Every random draw of step ``s`` comes from ``fold_in(run_key, s)``, and everything that carries
over between steps (parameters, optimiser state, controller states, the stale-parameter queue
and its weight versions) is in the checkpoint, so a run killed and resumed draws the same
prompts and samples and ends with the same metrics as an uninterrupted one.

The prompt scheduler (``config.rl.scheduler``, :mod:`posttrain_jax.scheduling`) picks the step's
prompts among the env's ``P`` candidates and lays out the generation rows (``P * G``; CERO's
padded layout ``P * g_max`` rows with a ``valid`` mask: padding rows are masked out of the
advantages and the loss); a replay scheduler appends ``M`` stored rows (their behaviour
log-probs and advantages, the trainer's log-probs recomputed) to every update. Row counts are
static per run. Its state is checkpointed (JSON meta in the checkpoint meta, arrays in
``rl/scheduler/<step>.npz``) and restored on resume, so a resumed run keeps the same schedule.

On a mesh: the train states lie in the trainer's layout, the sampler reads a copy in its own
layout and precision (rollout.InferenceWeights, rebuilt only when the weight version, i.e. the
trainer's step, changes), and with several processes each one encodes, decodes and scores its
own rows of the batch; only process 0 writes metrics.
"""

import dataclasses
import os
import time
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from posttrain_jax import io as ptio
from posttrain_jax import modelops, objectives, parallel, registry, rollout, streams
from posttrain_jax.objectives import refresh_rules
from posttrain_jax.train import async_rollouts as async_lib
from posttrain_jax.train import context as context_lib
from posttrain_jax.train import controls as controls_lib
from posttrain_jax.train import generation, hooks, loss_terms, samplers, stage_loop, updates
from posttrain_jax.train import inputs as inputs_lib
from posttrain_jax.train import prompts as prompts_lib
from posttrain_jax.train import rl_step as step_lib
from posttrain_jax.train import scheduler as scheduler_lib
from posttrain_jax.train import state as state_lib

UNIFORM_SCHEDULERS = (scheduler_lib.NONE, "uniform")  # G consecutive rows per prompt
REVIEW_EVENTS = "review_events"  # <rl>/review_events.jsonl: a review scheduler's visit events


def _items(section) -> tuple:
  return tuple(sorted(dict(section).items()))


def shared_prefix_group(
  cfg, model_config, *, scheduler_name: str, replay_rows: int, routing_replay: bool
) -> int:
  """Rollouts per prompt when the trainer's forwards (update, trainer and reference log-probs)
  run each prompt once for its whole group (``models.grouped_forward``), else 0.

  On with ``config.rl.shared_prefix`` where the update batch is the sampler's layout,
  ``group_size`` consecutive rows per prompt: the ``none`` / ``uniform`` scheduler (no other
  prompt scheduler), no replayed rows, minibatches of whole groups (``prompts_per_step``
  divisible by ``minibatches``), a dense model without routing replay. The logits are those of
  the full forward; the saving is the prompt's share of the tokens times ``1 - 1/group_size``.
  A batch that breaks the layout is caught by the update's ``train/prefix_mismatch`` count
  (:func:`~posttrain_jax.train.rl_step.rl_step` raises).
  """
  if not cfg.shared_prefix or cfg.group_size < 2:
    return 0
  if (
    scheduler_name not in UNIFORM_SCHEDULERS
    or replay_rows
    or cfg.prompts_per_step % cfg.minibatches
    or routing_replay
    or model_config.num_experts
  ):
    return 0
  return int(cfg.group_size)


def loss_config(cfg, step_delimiters=(), group: int = 0, **methods) -> updates.RLLossConfig:
  """The update's loss settings from ``config.rl``; ``methods``: the settings the active
  methods give (``hooks.loss_settings``, e.g. the teacher's distillation term)."""
  return updates.RLLossConfig(
    policy_loss=cfg.policy_loss,
    policy_loss_kwargs=_items(cfg.policy_loss_kwargs),
    aggregation=cfg.aggregation,
    # Dr. GRPO's constant: the generation budget, also when the batch is trimmed narrower.
    norm_length=cfg.norm_length or cfg.max_new_tokens,
    kl_coef=cfg.kl_coef,
    kl_estimator=cfg.kl_estimator,
    kl_estimator_kwargs=_items(cfg.kl_estimator_kwargs),
    kl_aggregation=cfg.kl_aggregation,
    kl_bias_correction=cfg.kl_bias_correction,
    kl_in_reward=cfg.kl_in_reward,
    entropy_coef=cfg.entropy_coef,
    temperature=cfg.temperature,
    epochs=cfg.epochs,
    minibatches=cfg.minibatches,
    dcmdp=cfg.dcmdp.enabled,
    aux_loss=cfg.aux_loss,
    aux_loss_kwargs=_items(cfg.aux_loss_kwargs),
    num_groups=cfg.prompts_per_step,
    step_delimiters=tuple(step_delimiters),
    beta_from_controls=cfg.hpo.controller == "a_hpo",
    loss_reads_group=bool(cfg.hpo.group_length_norm),
    mismatch_in_loss=not inputs_lib.required(cfg).trainer,
    group=group,
    max_update_ratio=float(cfg.max_update_ratio),
    **methods,
  )


def needs_reference(config, methods) -> bool:
  """Whether the run computes the reference's log-probs: a piece reads them (the KL term), or
  an active method of ``methods`` needs the reference's forward (a teacher that is the
  reference)."""
  needs = inputs_lib.required(config.rl)
  fields = needs.update | needs.advantage
  return bool({"ref_logprobs", "ref_logits"} & fields) or hooks.asks(
    methods, config, "reads_reference"
  )


def keeps_start(config, methods) -> bool:
  """Whether the run keeps the frozen RL start: the reference's forward, a method that reads
  the start's parameters, or a reference refreshed by ``config.rl.ref_rule``."""
  return (
    needs_reference(config, methods)
    or hooks.asks(methods, config, "reads_start")
    or config.rl.ref_rule != "never"
  )


def prefix_group(ctx) -> int:
  """The shared-prompt forward's rows per prompt of the run of ``ctx`` (:func:`shared_prefix_group`
  with its scheduler and model), for a method that builds a forward of its own."""
  cfg = ctx.config.rl
  scheduler = scheduler_lib.make(cfg)
  return shared_prefix_group(
    cfg,
    nnx.merge(ctx.graphdef, ctx.init_params).config,
    scheduler_name=scheduler_lib.name_of(cfg),
    replay_rows=scheduler_lib.replay_rows(scheduler, cfg.prompts_per_step),
    routing_replay=cfg.routing_replay,
  )


@dataclasses.dataclass(frozen=True)
class RLFunctions:
  """The compiled functions of one RL run (immutable; built once by :func:`build_run`).
  Optional ones are None when no selected piece needs them."""

  sample: Callable  # (weights, tokens, mask, key, version) -> Rollout
  update: Callable  # (policy state, TrainBatch, controls, key) -> (state, metrics)
  advantages: Callable  # (AdvantageInputs) -> (advantages, metrics)
  trainer_logprobs: Callable  # (params, tokens, start, routes) -> [B, T]
  is_weights: Callable  # (trainer, behaviour, mask) -> (weights, metrics)
  mismatch: Callable  # (trainer, behaviour, mask) -> metrics
  full: Callable  # trainable params -> the full model's (LoRA: base + adapters)
  ref_logprobs: Callable | None = None  # (params, tokens, start, routes) -> [B, T] (, logits)
  returns: Callable | None = None  # (token rewards, values, mask) -> GAE returns
  routing_overlap: Callable | None = None
  hidden: Callable | None = None  # (params, tokens, start) -> [B, T, D] last layer (Hista)
  concat_rows: Callable | None = None  # (fresh TrainBatch, replayed) -> one batch


@dataclasses.dataclass(frozen=True)
class Layout:
  """The run's static shape: rows, the shared-prompt group, trimming, what is computed."""

  gen_rows: int  # generation rows per step (P * G; CERO padded P * g_max)
  replay_rows: int  # M replayed rows appended to every update
  group: int  # shared-prompt forward's rows per prompt (0: off)
  trim_min: int  # completion trimming's minimum width (0: off)
  dynamic_rounds: int  # DAPO dynamic sampling's draw rounds (0: off)
  routing_replay: bool
  record_routes: bool  # MoE, single-turn: rollouts record routes (replayed or only compared)
  scheduler_name: str
  needs: inputs_lib.Needs


@dataclasses.dataclass
class Host:
  """Host-side state of the run: the prompt scheduler and source, the sampler's weight copy,
  the review event log, and the step count used when a caller passes none (benchmarks)."""

  scheduler: object
  prompts: prompts_lib.PromptSource
  weights: rollout.InferenceWeights
  event_log: object = None
  next_step: int = 0


@dataclasses.dataclass(frozen=True)
class RLRun:
  fns: RLFunctions
  layout: Layout
  host: Host
  # The active methods' built objects by name (train/hooks.py: ``Method.build``).
  methods: dict = dataclasses.field(default_factory=dict)


def _layout(ctx, cfg, scheduler, model_config) -> Layout:
  name = scheduler_lib.name_of(cfg)
  gen = scheduler_lib.gen_rows(scheduler, cfg.prompts_per_step)
  replay = scheduler_lib.replay_rows(scheduler, cfg.prompts_per_step)
  # A prompt scheduler stores rows and trains on them with later batches: full width.
  trim = int(cfg.trim_min_length) if cfg.trim_completions and name == scheduler_lib.NONE else 0
  dynamic = cfg.dynamic_sampling
  return Layout(
    gen_rows=gen,
    replay_rows=replay,
    group=shared_prefix_group(
      cfg, model_config, scheduler_name=name, replay_rows=replay, routing_replay=cfg.routing_replay
    ),
    trim_min=trim,
    dynamic_rounds=int(dynamic.max_rounds) if dynamic.enabled else 0,
    routing_replay=bool(cfg.routing_replay),
    record_routes=bool(cfg.routing_replay)
    or (model_config.num_experts > 0 and not samplers.inserts(ctx) and not dynamic.enabled),
    scheduler_name=name,
    needs=inputs_lib.required(cfg),
  )


def build_run(
  ctx: context_lib.Context,
  tx,
  *,
  run_state: dict,
  base=None,
  methods: dict | None = None,
) -> RLRun:
  """The run's compiled functions, static layout and host state (``methods``: the active
  methods' built objects, ``hooks.build_all``; built here when not given)."""
  cfg = ctx.config.rl
  S, temp, place = ctx.prompt_len, cfg.temperature, ctx.placement
  scheduler = scheduler_lib.make(cfg)
  model_config = nnx.merge(ctx.graphdef, ctx.init_params).config
  layout = _layout(ctx, cfg, scheduler, model_config)
  rows = layout.gen_rows + layout.replay_rows
  smesh = ctx.rollout_mesh  # config.sampler_mesh, else the run's mesh
  sampler_cfg = dataclasses.replace(
    ctx.sampler_config(
      temperature=temp, max_new_tokens=cfg.max_new_tokens, top_k=cfg.top_k, top_p=cfg.top_p
    ),
    record_routing=layout.record_routes,
    prefill_group=layout.group,
    **hooks.sampler_settings(ctx.methods, ctx.config),
  )
  delimiters = [ctx.tokenizer.convert_tokens_to_ids(c) for c in cfg.step_delimiters]
  loss_cfg = loss_config(
    cfg, delimiters, layout.group, **hooks.loss_settings(ctx.methods, ctx.config)
  )
  layout = dataclasses.replace(
    layout, needs=inputs_lib.with_update_fields(layout.needs, loss_terms.reads(loss_cfg))
  )
  step_sh = place.step_shardings(place.state_shardings(run_state["policy"].params, tx), rows)
  jit = parallel.executables.jit
  is_fn = registry.lookup(objectives.IS_CORRECTIONS, cfg.is_correction, "IS correction")
  is_kwargs = dict(cfg.is_correction_kwargs)
  fns = dict(
    sample=samplers.make_sampler(ctx, sampler_cfg, mesh=smesh),
    advantages=updates.make_advantage_fn(
      cfg.advantage, _items(cfg.advantage_kwargs), cfg.prompts_per_step
    ),
    trainer_logprobs=updates.make_logprob_fn(ctx.graphdef, S, temp, group=layout.group),
    is_weights=jit(
      lambda t, s, m: is_fn(t, s, m, **is_kwargs),
      name="rl.is_weights",
      static=(cfg.is_correction, _items(cfg.is_correction_kwargs)),
    ),
    mismatch=jit(objectives.mismatch_metrics, name="rl.mismatch_metrics"),
  )
  # LoRA: the policy state holds only the adapters; every forward runs on base + adapters
  # (``full``), the base is frozen and is also the reference (one copy of the base weights).
  lcfg = lora_config(cfg)
  if lcfg is None:
    fns["full"] = lambda params: params
    fns["update"] = updates.make_rl_update(ctx.graphdef, tx, S, loss_cfg, shardings=step_sh)
  else:
    view = lambda adapters, frozen: modelops.lora.apply(frozen, adapters, lcfg)
    apply = jax.jit(view)
    fns["full"] = lambda adapters: apply(adapters, base)
    update = updates.make_rl_update(
      ctx.graphdef,
      tx,
      S,
      loss_cfg,
      shardings=step_sh,
      view=view,
      frozen_shardings=place.param_shardings(base),
    )
    fns["update"] = lambda state, batch, controls, key: update(state, batch, controls, key, base)
  if needs_reference(ctx.config, ctx.methods):
    fns["ref_logprobs"] = updates.make_logprob_fn(
      ctx.graphdef, S, temp, with_logits="ref_logits" in layout.needs.update, group=layout.group
    )
  if "hidden" in layout.needs.advantage | layout.needs.update:
    fns["hidden"] = updates.make_hidden_fn(ctx.graphdef, S)
  if layout.record_routes:
    fns["routing_overlap"] = updates.make_routing_overlap_fn(ctx.graphdef, S)
  if layout.replay_rows:
    fns["concat_rows"] = jax.jit(
      lambda a, b: jax.tree.map(lambda x, y: jnp.concatenate([x, y]), a, b),
      out_shardings=place.rows(rows),
    )
  if methods is None:
    methods = hooks.build_all(ctx, base)
  curated = hooks.prompt_dataset(ctx, methods)  # a method's pool of prompts, or None
  host = Host(
    scheduler=scheduler,
    prompts=prompts_lib.PromptSource(
      ctx.config,
      ctx.env,
      ctx.dataset if curated is None else curated,
      all_levels=curated is not None,
    ),
    weights=rollout.InferenceWeights(cfg.sampler_precision, mesh=smesh),
  )
  return RLRun(RLFunctions(**fns), layout, host, methods)


def async_settings(cfg) -> dict | None:
  """``config.rl.async_rollouts`` as producer kwargs, None when off (validate.py checks it)."""
  section = cfg.async_rollouts
  if not section.enabled:
    return None
  return {"queue_size": int(section.queue_size), "max_staleness": int(section.max_staleness)}


def lora_config(cfg):
  """The run's LoRA adapters (``config.rl.lora``), or None for full fine-tuning (rank 0)."""
  section = cfg.lora
  if not section or not section.rank:
    return None
  return modelops.LoraConfig(rank=section.rank, alpha=section.alpha, targets=tuple(section.targets))


def init_run_state(
  cfg,
  init_params,
  tx,
  placement=None,
  method_slots: dict | None = None,
) -> dict:
  """Everything carried between steps (and checkpointed): the policy's train state,
  controller values, the queue of stale parameters the sampler reads and their weight versions
  (``history_versions``, host ints kept in the checkpoint's meta), and the slots the active
  methods add (``method_slots``, ``hooks.init_states``). With a ``placement`` the states are created in
  their shardings on its mesh."""
  init = state_lib.init_state if placement is None else placement.init_state
  policy = init(init_params, tx)
  controls = controls_lib.init_controls(cfg)
  if placement is not None:
    controls = placement.put_replicated(controls)
  history = [jax.tree.map(jnp.copy, init_params) for _ in range(cfg.staleness)]
  out = {
    "policy": policy,
    "controls": controls,
    "history": history,
    "history_versions": [0] * cfg.staleness,
  }
  if cfg.ref_rule != "never":  # a reference refreshed from the policy (TRL's sync_ref_model)
    out["reference"] = jax.tree.map(jnp.copy, init_params)
    out["reference_rule"] = refresh_rules.init_state(cfg.ref_rule, **dict(cfg.ref_rule_kwargs))
  clash = set(method_slots or {}) & set(out)
  if clash:
    raise ValueError(f"a method's run-state slots {sorted(clash)} are the engine's own")
  out.update(method_slots or {})
  return out


HOST_KEYS = ("history_versions", "reference_rule")


def _arrays(run_state: dict, host_keys: tuple = ()) -> dict:
  """The part of the run state saved as arrays (host values, ``HOST_KEYS`` and the active
  methods' ``host_state``, go into the meta)."""
  return {k: v for k, v in run_state.items() if k not in HOST_KEYS + tuple(host_keys)}


def run(ctx: context_lib.Context, init_params, *, stage: str = "rl"):
  """GRPO-family training from ``init_params``; resumes from the last checkpoint. ``stage``:
  the folder and name of the stage (train/stages.py: a run may hold several RL stages)."""
  cfg = ctx.config.rl
  out_dir = ctx.stage_dir(stage)
  # --- setup -----------------------------------------------------------------------------------
  tx = state_lib.make_optimizer(**state_lib.optimizer_kwargs(cfg))
  built = hooks.build_all(ctx, init_params)  # the active methods' host objects (models, functions)
  method_slots = hooks.init_states(ctx, built, init_params)
  init_params = ctx.placement.place(init_params)
  lcfg = lora_config(cfg)
  trainable = init_params
  if lcfg is not None:  # train adapters; the frozen base is the reference (no copy)
    trainable = modelops.lora.init(
      init_params, lcfg, jax.random.fold_in(ctx.key, streams.tag("lora"))
    )
  run_state = init_run_state(
    cfg,
    trainable,
    tx,
    ctx.placement,
    method_slots,
  )
  ref_params = None
  if keeps_start(ctx.config, ctx.methods):
    ref_params = init_params if lcfg is not None else jax.tree.map(jnp.copy, init_params)
  ckpt = ptio.Checkpointer(os.path.join(out_dir, "checkpoints"), max_to_keep=2, async_save=True)
  writer = ptio.MetricWriter(out_dir, tensorboard=ctx.config.tensorboard, enabled=ctx.is_primary)
  start, elapsed, nonfinite, saved_scheduler, saved_prompts, rollouts = 0, 0.0, 0, None, None, 0.0
  host_keys = hooks.host_state_keys(ctx.methods, ctx.config)
  restored = ckpt.restore_latest(_arrays(run_state, host_keys), fallback=ctx.fallback_checkpoint)
  if restored is not None:
    arrays, meta = restored
    start, elapsed, nonfinite = meta["step"], meta.get("elapsed", 0.0), meta.get("nonfinite", 0)
    saved_scheduler = meta.get("scheduler")
    saved_prompts, rollouts = meta.get("prompts"), meta.get("rollouts", 0.0)
    run_state = {
      **arrays,
      "history_versions": meta.get(
        "history_versions", [max(start - cfg.staleness + i, 0) for i in range(cfg.staleness)]
      ),
    }
    for key in ("reference_rule",) + host_keys:  # e.g. the refresh rules continue where they left
      if key in meta:
        run_state[key] = meta[key]
    for name, rule_state in meta.get(
      "rule_states", {}
    ).items():  # a checkpoint with one dict of rule states
      if f"{name}_rule" in run_state:
        run_state[f"{name}_rule"] = rule_state
  writer.resume(start)  # the record up to the checkpoint; nothing without one (step 0 eval too)
  rl_run = build_run(ctx, tx, run_state=run_state, base=init_params, methods=built)
  with_scheduler = rl_run.layout.scheduler_name != scheduler_lib.NONE
  if with_scheduler and start:  # the schedule continues where the checkpoint left it
    if saved_scheduler is None:
      raise registry.ConfigError(
        f"rl checkpoint of step {start} holds no state of scheduler "
        f"{rl_run.layout.scheduler_name!r}; it was written with another "
        "config.rl.scheduler.name (resume with that one or a fresh workdir)"
      )
    scheduler_lib.load(rl_run.host.scheduler, out_dir, start, saved_scheduler)
  if rl_run.host.scheduler.logs_events:  # e.g. review's visit events (the repair window)
    rl_run.host.event_log = ptio.MetricWriter(
      out_dir, name=REVIEW_EVENTS, tensorboard=False, enabled=ctx.is_primary
    )
    rl_run.host.event_log.truncate_after(start - 1)
  if start and saved_prompts is not None:
    rl_run.host.prompts.load_state_dict(saved_prompts)
  elif start and rl_run.host.prompts.curriculum is not None:
    rl_run.host.prompts.load_state_dict({})  # raises: the checkpoint has no curriculum state
  evaluator = ctx.make_evaluator(cfg.eval_problems, pass_n=0)
  evaluators = [evaluator]
  if ctx.heldout_env is not None:  # the held-out env too (generalisation)
    evaluators.append(ctx.make_evaluator(cfg.eval_problems, pass_n=0, heldout=True))
  for m in hooks.with_hook(ctx.methods, ctx.config, "rl_evaluator"):  # e.g. OPSD's gap G0
    extra = m.rl_evaluator(ctx, rl_run.methods[m.name], evaluator)
    if extra is not None:
      evaluators.append(extra)
  if len(evaluators) > 1:
    evaluator = lambda params, key: {k: v for e in evaluators for k, v in e(params, key).items()}
  run_key = jax.random.fold_in(ctx.key, streams.tag("rl"))
  bar = ptio.Progress(
    cfg.steps,
    initial=start,
    desc=stage,
    enabled=ctx.show_progress,
    keys=("reward/mean", "eval/accuracy"),
  )
  if start == 0 and cfg.eval_every:
    writer.write(0, evaluator(rl_run.fns.full(run_state["policy"].params), ctx.eval_key))
  producer = None
  settings = async_settings(cfg)
  if settings is not None:  # asynchronous rollouts: generation in a producer thread
    if jax.process_count() > 1:
      raise registry.ConfigError(
        "config.rl.async_rollouts runs on one host; disable it for a "
        f"{jax.process_count()}-process run"
      )
    async_key = jax.random.fold_in(run_key, streams.tag("async", start))
    producer = async_lib.RolloutProducer(
      lambda params, version, n: generation.generate(
        ctx, rl_run, params, version, jax.random.fold_in(async_key, n), start + n
      ),
      **settings,
    )
    producer.publish(
      jax.tree.map(jnp.copy, run_state["policy"].params), int(run_state["policy"].step)
    )
    producer.start()
  counters = {
    "start": start,
    "rollouts": rollouts,
    "nonfinite": nonfinite,
    "t0": time.time() - elapsed,
  }
  try:
    run_state = _loop(
      ctx,
      rl_run,
      run_state,
      ref_params,
      run_key,
      producer,
      counters,
      evaluator,
      (writer, bar, ckpt, out_dir),
    )
  finally:
    if producer is not None:
      producer.stop()
    ckpt.close()  # a save in flight (good data) completes, also when the run stops
  if 0 < cfg.pause_after <= counters["done"] < cfg.steps:  # checkpointed, not finished
    bar.close()
    writer.close()
    raise registry.StagePaused(stage, counters["done"])
  # --- finish ----------------------------------------------------------------------------------
  bar.close()
  writer.close()
  last = ptio.read_jsonl(writer.path)[-1] if cfg.steps and ctx.is_primary else {}
  final = rl_run.fns.full(run_state["policy"].params)  # LoRA: merged into the base, export-ready
  if lcfg is not None:
    last["lora/params"] = modelops.lora.num_params(run_state["policy"].params)
  for m in hooks.with_hook(ctx.methods, ctx.config, "finish"):  # e.g. the critic's parameters
    m.finish(ctx, rl_run.methods[m.name], run_state, stage)
  ctx.save_final(stage, final, {"steps": cfg.steps, **last})
  return final


def _loop(ctx, rl_run, run_state, ref_params, run_key, producer, counters, evaluator, outputs):
  """The RL steps from ``counters['start']`` in the one stage loop (train/stage_loop.py), with
  RL's stop rule (the rollout budget) and checkpoint meta; returns the final run state.
  ``outputs``: (metric writer, progress bar, checkpointer, stage dir)."""
  cfg = ctx.config.rl
  writer, bar, ckpt, out_dir = outputs
  budget, pause = cfg.max_rollouts, cfg.pause_after if cfg.pause_after < cfg.steps else 0
  with_scheduler = rl_run.layout.scheduler_name != scheduler_lib.NONE
  host_keys = hooks.host_state_keys(ctx.methods, ctx.config)
  rollouts = [counters["rollouts"]]  # the running total (the step adds to it)
  counters["done"] = counters["start"]

  def one_step(run_state, step):
    run_state, record = step_lib.rl_step(
      ctx, rl_run, run_state, ref_params, jax.random.fold_in(run_key, step), step, producer
    )
    counters["done"] = step + 1
    rollouts[0] += record["rollouts/generated"]
    record["rollouts/total"] = rollouts[0]
    return run_state, record

  def save(done, run_state, record, nonfinite):
    meta = {
      "step": done,
      "elapsed": record["time/elapsed"],
      "nonfinite": nonfinite,
      "history_versions": run_state["history_versions"],
      "rollouts": rollouts[0],
      "prompts": rl_run.host.prompts.state_dict(),
    }
    for key in ("reference_rule",) + host_keys:  # host values of the run state
      if key in run_state:
        meta[key] = run_state[key]
    if with_scheduler:  # JSON part in the meta, arrays next to the checkpoint (npz)
      meta["scheduler"] = scheduler_lib.save(
        rl_run.host.scheduler, out_dir, done, write=ctx.is_primary
      )
    ckpt.save(done, _arrays(run_state, host_keys), meta)

  return stage_loop.train_loop(
    run_state,
    label="rl",
    cfg=cfg,
    start=counters["start"],
    step=one_step,
    evaluate=lambda run_state: evaluator(rl_run.fns.full(run_state["policy"].params), ctx.eval_key),
    checkpoint=save,
    writer=writer,
    bar=bar,
    t0=counters["t0"],
    skipped=counters["nonfinite"],
    skip_threshold=cfg.epochs * cfg.minibatches,
    stop=lambda: (
      bool(budget and rollouts[0] >= budget) or bool(pause and counters["done"] >= pause)
    ),
  )
