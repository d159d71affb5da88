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
import functools
import os
import time

import jax
import jax.numpy as jnp
from flax import nnx

from posttrain_jax import io as ptio
from posttrain_jax import modelops
from posttrain_jax import objectives
from posttrain_jax import parallel
from posttrain_jax import rollout
from posttrain_jax.train import async_rollouts as async_lib
from posttrain_jax.train import batch as batch_lib
from posttrain_jax.train import context as context_lib
from posttrain_jax.train import critic as critic_lib
from posttrain_jax.train import prompts as prompts_lib
from posttrain_jax.train import scheduler as scheduler_lib
from posttrain_jax.train import state as state_lib
from posttrain_jax.train import steps
from posttrain_jax.registry import ConfigError

OLD_LOGPROBS = ("behaviour", "recomputed")
UNIFORM_SCHEDULERS = (scheduler_lib.NONE, "uniform")  # G consecutive rows per prompt
ASYNC_STREAM = 1 << 20  # fold_in tag of the producer's batch keys
REVIEW_EVENTS = "review_events"  # <rl>/review_events.jsonl: a review scheduler's visit events


def _items(section) -> tuple:
  return tuple(sorted(dict(section).items()))


def shared_prefix_group(cfg, model_config, *, scheduler_name: str, replay_rows: int,
                        routing_replay: bool) -> int:
  """Rollouts per prompt when the trainer's forwards (update, trainer and reference log-probs)
  run each prompt once for its whole group (``models.Decoder.grouped``), else 0.

  On with ``config.rl.shared_prefix`` (default True) where the update batch is the sampler's
  layout, ``group_size`` consecutive rows per prompt: the ``none`` / ``uniform`` scheduler (no
  other prompt scheduler), no replayed rows, minibatches of whole groups (``prompts_per_step``
  divisible by ``minibatches``; each minibatch then holds whole groups instead of a row
  permutation's rows), a dense model without routing replay.
  The logits are those of the full forward; the saving is the prompt's share of the tokens
  times ``1 - 1/group_size``. A batch that breaks the layout is caught by the update's
  ``train/prefix_mismatch`` count (:func:`rl_iteration` raises).
  """
  if not cfg.get("shared_prefix", True) or cfg.group_size < 2:
    return 0
  if (scheduler_name not in UNIFORM_SCHEDULERS or replay_rows
      or cfg.prompts_per_step % cfg.minibatches or routing_replay or model_config.num_experts):
    return 0
  return int(cfg.group_size)


def loss_config(cfg, step_delimiters=(), group: int = 0) -> steps.RLLossConfig:
  return steps.RLLossConfig(
      policy_loss=cfg.policy_loss, policy_loss_kwargs=_items(cfg.policy_loss_kwargs),
      aggregation=cfg.aggregation,
      # Dr. GRPO's constant: the generation budget, also when the batch is trimmed narrower.
      norm_length=cfg.get("norm_length", None) or cfg.max_new_tokens,
      kl_coef=cfg.kl_coef, kl_estimator=cfg.kl_estimator, kl_in_reward=cfg.kl_in_reward,
      entropy_coef=cfg.entropy_coef, temperature=cfg.temperature, epochs=cfg.epochs,
      minibatches=cfg.minibatches, dcmdp=cfg.dcmdp.enabled, dcmdp_delta=cfg.dcmdp.delta,
      aux_loss=cfg.aux_loss, aux_loss_kwargs=_items(cfg.aux_loss_kwargs),
      num_groups=cfg.prompts_per_step, step_delimiters=tuple(step_delimiters),
      beta_from_controls=cfg.hpo.controller == "a_hpo",
      loss_reads_group=bool(cfg.hpo.group_length_norm),
      mismatch_in_loss=not needs_trainer_logprobs(cfg), group=group)


def needs_trainer_logprobs(cfg) -> bool:
  """Whether the batch needs the trainer's log-probs before the update: an IS correction,
  recomputed "old" log-probs or the KL in the reward. Otherwise that forward is skipped and the
  mismatch metrics come from the update's own first forward."""
  return (cfg.is_correction != "none" or cfg.old_logprobs == "recomputed"
          or bool(cfg.kl_coef and cfg.kl_in_reward))


# Re-exported: the batch assembly moved to train/batch.py.
score_rows, score_completions = batch_lib.score_rows, batch_lib.score_completions
zero_signal_fraction = batch_lib.zero_signal_fraction
TEACHER_ADVANTAGES = batch_lib.TEACHER_ADVANTAGES
GREEDY_BASELINE_ADVANTAGES = batch_lib.GREEDY_BASELINE_ADVANTAGES


def needs_reference(cfg) -> bool:
  return bool(cfg.kl_coef) or cfg.advantage in TEACHER_ADVANTAGES


def uses_critic(cfg) -> bool:
  return cfg.advantage == "gae"


class RLPieces:
  """The jitted functions of one RL run, and the sampler's weight copy."""

  def __init__(self, ctx: context_lib.Context, tx, critic_graphdef=None, critic_tx=None, *,
               run_state: dict, base=None):
    cfg = ctx.config.rl
    S, temp = ctx.prompt_len, cfg.temperature
    place, mesh = ctx.placement, ctx.mesh
    # The prompt scheduler (host-side) and the static row counts it implies: generation rows
    # (P * G; CERO padded: P * g_max) and update rows (plus M replayed rows).
    self.scheduler = scheduler_lib.make(cfg)
    self.scheduler_name = scheduler_lib.name_of(cfg)
    # Where candidates come from (env / static dataset in epochs / curriculum over a mixed env)
    # and DAPO dynamic sampling's bound on draw rounds (0: off).
    self.prompts = prompts_lib.PromptSource(ctx.config, ctx.env, ctx.dataset)
    self.dynamic_rounds = dynamic_rounds(cfg)
    self.gen_rows = scheduler_lib.gen_rows(self.scheduler, cfg.prompts_per_step)
    self.replay_rows = scheduler_lib.replay_rows(self.scheduler, cfg.prompts_per_step)
    self.next_step = 0  # the scheduler's step when a caller passes none (benchmarks)
    self.event_log = None  # review schedulers: a MetricWriter of visit events (set by run)
    rows = self.gen_rows + self.replay_rows
    if self.replay_rows:
      self.concat_rows = jax.jit(
          lambda a, b: jax.tree.map(lambda x, y: jnp.concatenate([x, y]), a, b),
          out_shardings=place.rows(rows))
    # Routing replay (MoE): the sampler records each position's experts, every trainer-side
    # forward (update, recomputed old log-probs, reference) replays them.
    self.routing_replay = bool(cfg.get("routing_replay", False))
    model_config = nnx.merge(ctx.graphdef, ctx.init_params).config
    if self.routing_replay and not model_config.num_experts:
      raise ConfigError("config.rl.routing_replay needs a mixture-of-experts model "
                        "(num_experts > 0, e.g. model.preset='nano_moe'); set it to False for a "
                        "dense model")
    # Completion trimming (config.rl.trim_completions): the minimum width (0: off). A prompt
    # scheduler stores rows and trains on them with later batches, so it keeps the full width.
    self.trim_min = 0
    if cfg.get("trim_completions", True) and self.scheduler_name == scheduler_lib.NONE:
      self.trim_min = int(cfg.get("trim_min_length", 16))
    self.group = shared_prefix_group(
        cfg, model_config, scheduler_name=self.scheduler_name,
        replay_rows=self.replay_rows, routing_replay=self.routing_replay)
    sampler_cfg = dataclasses.replace(ctx.sampler_config(
        temperature=temp, max_new_tokens=cfg.max_new_tokens, top_k=cfg.top_k, top_p=cfg.top_p),
                                      record_routing=self.routing_replay,
                                      prefill_group=self.group)
    # The samplers run on config.sampler_mesh when set (their rollouts then move to the
    # trainer's rows: batch._draw), else on the run's mesh.
    smesh = ctx.rollout_mesh
    self.sample = rollout.make_sampler(ctx.graphdef, sampler_cfg, mesh=smesh,
                                       executables=ctx.executables)
    self.weights = rollout.InferenceWeights(cfg.sampler_precision, mesh=smesh)
    delimiters = [ctx.tokenizer.convert_tokens_to_ids(c) for c in cfg.step_delimiters]
    loss_cfg = loss_config(cfg, delimiters, self.group)
    policy_sh = place.state_shardings(run_state["policy"].params, tx)
    step_sh = place.step_shardings(policy_sh, rows)
    # LoRA: the policy state holds only the adapters; every forward runs on base + adapters
    # (``full``), the base is frozen and is also the reference (one copy of the base weights).
    self.lora = lora_config(cfg)
    if self.lora is None:
      self.full = lambda params: params
      self.update = steps.make_rl_update(ctx.graphdef, tx, S, loss_cfg,
                                         shardings=step_sh, executables=ctx.executables)
    else:
      lcfg = self.lora
      view = lambda adapters, frozen: modelops.lora.apply(frozen, adapters, lcfg)
      apply = jax.jit(view)
      self.full = lambda adapters: apply(adapters, base)
      update = steps.make_rl_update(ctx.graphdef, tx, S, loss_cfg,
                                    shardings=step_sh, view=view,
                                    frozen_shardings=place.param_shardings(base),
                                    executables=ctx.executables)
      self.update = lambda state, batch, controls, key: update(state, batch, controls, key,
                                                               base)
    self.advantages = steps.make_advantage_fn(cfg.advantage, _items(cfg.advantage_kwargs),
                                              cfg.prompts_per_step, executables=ctx.executables)
    self.trainer_logprobs = steps.make_logprob_fn(ctx.graphdef, S, temp, group=self.group,
                                                  executables=ctx.executables)
    self.need_trainer = needs_trainer_logprobs(cfg)
    self.routing_overlap = (steps.make_routing_overlap_fn(ctx.graphdef, S)
                            if self.routing_replay else None)
    self.ref_logprobs = None
    if needs_reference(cfg):
      self.ref_logprobs = steps.make_logprob_fn(
          ctx.graphdef, S, temp, with_logits=cfg.kl_estimator in steps.FULL_KL,
          group=self.group, executables=ctx.executables)
    self.greedy = None
    if cfg.advantage in GREEDY_BASELINE_ADVANTAGES:
      self.greedy = rollout.make_sampler(ctx.graphdef, ctx.sampler_config(
          temperature=0.0, max_new_tokens=cfg.max_new_tokens), mesh=smesh,
                                         executables=ctx.executables)
    is_fn = objectives.lookup(objectives.IS_CORRECTIONS, cfg.is_correction, "IS correction")
    is_kwargs = dict(cfg.is_correction_kwargs)
    jit = functools.partial(parallel.executables.jit, cache=ctx.executables)
    self.is_weights = jit(lambda t, s, m: is_fn(t, s, m, **is_kwargs), name="rl.is_weights",
                          static=(cfg.is_correction, _items(cfg.is_correction_kwargs)))
    self.mismatch = jit(objectives.mismatch_metrics, name="rl.mismatch_metrics")
    self.values = self.critic_update = None
    if critic_graphdef is not None:
      self.values = critic_lib.make_value_fn(critic_graphdef, S)
      critic_sh = place.state_shardings(run_state["critic"].params, critic_tx)
      self.critic_update = critic_lib.make_critic_update(
          critic_graphdef, critic_tx, S, clip_eps=cfg.value_clip,
          shardings=place.step_shardings(critic_sh, self.gen_rows))
      gae_kw = {k: v for k, v in dict(cfg.advantage_kwargs).items() if k in ("gamma", "lam")}
      self.returns = jax.jit(lambda r, v, m: objectives.gae_advantages(
          objectives.terminal_rewards(r, m), v, m, **gae_kw)[1])


def _update_controls(cfg, controls: dict, metrics: dict) -> dict:
  """Pure controller updates from this step's metrics (DCMDP λ, adaptive KL β)."""
  controls = dict(controls)
  if cfg.dcmdp.enabled:
    state = objectives.DCMDPState(lam=controls["dcmdp_lam"])
    state = objectives.dcmdp_update(state, metrics, lr=cfg.dcmdp.lr, lam_max=cfg.dcmdp.lam_max,
                                    delta=cfg.dcmdp.delta)
    controls["dcmdp_lam"] = state.lam
  if cfg.kl_coef and cfg.kl_controller == "adaptive" and "kl/ref" in metrics:
    state = objectives.KLControllerState(coef=controls["kl_coef"])
    state = objectives.adaptive_kl_controller(
        state, metrics, n_steps=cfg.prompts_per_step * cfg.group_size, target=cfg.kl_target,
        horizon=cfg.kl_horizon)
    controls["kl_coef"] = state.coef
  return controls


def _pre_update_controls(cfg, controls: dict, batch: dict) -> dict:
  """Controllers that read this step's batch before the update (A-HPO's β from its signs)."""
  if cfg.hpo.controller != "a_hpo":
    return controls
  _, counts = objectives.a_hpo_beta(batch["advantages"], batch["mask"])
  state = objectives.a_hpo_update(objectives.AHPOState(beta=controls["hpo_beta"]), counts,
                                  beta_min=cfg.hpo.beta_min, rule=cfg.hpo.rule,
                                  momentum=cfg.hpo.momentum)
  return {**controls, "hpo_beta": state.beta}


def rl_iteration(ctx, pieces: RLPieces, run_state: dict, ref_params, key,
                 step: int | None = None, producer=None) -> tuple[dict, dict]:
  """One iteration: prompts -> rollouts -> rewards -> advantages -> update -> controllers.
  ``step`` (the RL step, for the scheduler) defaults to a count of this ``pieces``' calls.
  With a ``producer`` (asynchronous rollouts) the batch comes from its queue and the updated
  parameters are published to it."""
  cfg = ctx.config.rl
  if step is None:
    step = pieces.next_step
  pieces.next_step = step + 1
  if ctx.executables is not None:  # a rerun: load the stored update etc. while sampling
    ctx.executables.prefetch()
  t0 = time.perf_counter()
  if producer is None:  # texts are scored on the host
    gen = batch_lib.generate(ctx, pieces, *batch_lib.behaviour_weights(run_state), key, step)
    async_metrics = {}
  else:
    gen, async_metrics = producer.get(int(run_state["policy"].step))
  t1 = time.perf_counter()
  batch, record = batch_lib.train_batch(ctx, pieces, run_state, ref_params, gen, key, step)
  record.update(async_metrics)
  old_params = run_state["policy"].params
  history, versions = run_state["history"], run_state["history_versions"]
  if history:  # keep the sampler `staleness` steps behind: push a copy before donation
    history = history[1:] + [jax.tree.map(jnp.copy, old_params)]
    versions = versions[1:] + [int(run_state["policy"].step)]
  critic_batch = batch.pop("critic", None)
  controls = _pre_update_controls(cfg, run_state["controls"], batch)
  policy, metrics = pieces.update(run_state["policy"], batch, controls,
                                  jax.random.fold_in(key, 2))
  new_state = {**run_state, "policy": policy, "history": history,
               "history_versions": versions}
  if critic_batch is not None:
    for _ in range(cfg.critic_updates):
      new_state["critic"], critic_metrics = pieces.critic_update(new_state["critic"],
                                                                 critic_batch)
    metrics = {**metrics, **critic_metrics}
  if producer is not None:  # the producer samples from a copy (the state is donated next step)
    producer.publish(jax.tree.map(jnp.copy, new_state["policy"].params),
                     int(new_state["policy"].step))
  record = context_lib.as_floats({**record, **metrics})  # one host sync for everything
  if record.get("train/prefix_mismatch", 0.0) > 0:
    raise context_lib.TrainingError(
        f"rl: {record['train/prefix_mismatch']:g} rows of the update batch do not share their "
        f"group's prompt (rows g*{pieces.group} .. (g+1)*{pieces.group}-1 should), which the "
        "shared-prompt forward assumes; set config.rl.shared_prefix=False (and report the "
        "layout that broke it)")
  # Stage times: sampling + scoring, then everything else up to the synced metrics (reference
  # and trainer log-probs, advantages, the update).
  record["time/generate_s"] = t1 - t0
  record["time/train_s"] = time.perf_counter() - t1
  record["sampler/weight_version"] = float(gen.version)
  record["sampler/resynced"] = float(pieces.weights.last_resynced)
  if cfg.hpo.controller:
    record["control/hpo_beta"] = float(controls["hpo_beta"])
  controls = _update_controls(cfg, controls, record)
  record["control/kl_coef"] = float(controls["kl_coef"])
  if cfg.dcmdp.enabled:
    record["control/dcmdp_lam"] = float(controls["dcmdp_lam"])
  new_state["controls"] = ctx.placement.put_replicated(controls)
  return new_state, record


def async_settings(cfg) -> dict | None:
  """``config.rl.async_rollouts`` as producer kwargs, None when off (with its ConfigErrors)."""
  section = cfg.get("async_rollouts", None)
  if section is None or not section.enabled:
    return None
  if scheduler_lib.name_of(cfg) not in (scheduler_lib.NONE, "uniform"):
    raise ConfigError("config.rl.async_rollouts generates in a background thread; the prompt "
                      f"scheduler {scheduler_lib.name_of(cfg)!r} keeps state the trainer also "
                      "updates (set config.rl.scheduler.name='none' or disable async_rollouts)")
  if cfg.staleness:
    raise ConfigError("config.rl.async_rollouts replaces the synchronous config.rl.staleness "
                      "queue; set config.rl.staleness=0 and bound the lag with "
                      "config.rl.async_rollouts.max_staleness")
  if section.queue_size < 1 or section.max_staleness < 0:
    raise ConfigError("config.rl.async_rollouts needs queue_size >= 1 and max_staleness >= 0, "
                      f"got {section.queue_size}, {section.max_staleness}")
  return {"queue_size": int(section.queue_size), "max_staleness": int(section.max_staleness)}


def dynamic_rounds(cfg) -> int:
  """DAPO dynamic sampling's ``max_rounds`` (``config.rl.dynamic_sampling``), 0 when off."""
  section = cfg.get("dynamic_sampling", None)
  if section is None or not section.enabled:
    return 0
  if scheduler_lib.name_of(cfg) not in (scheduler_lib.NONE, "uniform"):
    raise ConfigError("config.rl.dynamic_sampling refills whole groups of a fixed size; it "
                      f"cannot be combined with scheduler {scheduler_lib.name_of(cfg)!r} (set "
                      "config.rl.scheduler.name='none' or disable dynamic sampling)")
  if section.max_rounds < 1:
    raise ConfigError(f"config.rl.dynamic_sampling.max_rounds must be >= 1, got "
                      f"{section.max_rounds}")
  return int(section.max_rounds)


def lora_config(cfg):
  """The run's LoRA adapters (``config.rl.lora``), or None for full fine-tuning (rank 0)."""
  section = cfg.get("lora", None)
  if not section or not section.rank:
    return None
  return modelops.LoraConfig(rank=section.rank, alpha=section.alpha,
                             targets=tuple(section.targets))


def init_run_state(cfg, init_params, tx, critic_params=None, critic_tx=None,
                   placement=None) -> dict:
  """Everything carried between steps (and checkpointed): policy and critic train states,
  controller values, the queue of stale parameters the sampler reads and their weight versions
  (``history_versions``, host ints kept in the checkpoint's meta). With a ``placement`` the
  states are created in their shardings on its mesh."""
  init = state_lib.init_state if placement is None else placement.init_state
  policy = init(init_params, tx)
  controls = {"kl_coef": jnp.asarray(cfg.kl_coef, jnp.float32),
              "dcmdp_lam": jnp.asarray(cfg.dcmdp.lam0, jnp.float32),
              "hpo_beta": objectives.a_hpo_init().beta}
  if placement is not None:
    controls = placement.put_replicated(controls)
  history = [jax.tree.map(jnp.copy, init_params) for _ in range(cfg.staleness)]
  out = {"policy": policy, "controls": controls, "history": history,
         "history_versions": [0] * cfg.staleness}
  if critic_params is not None:
    if placement is not None:
      critic_params = placement.place(critic_params)
    out["critic"] = init(critic_params, critic_tx)
  return out


HOST_KEYS = ("history_versions",)


def _arrays(run_state: dict) -> dict:
  """The part of the run state saved as arrays (host values go into the meta)."""
  return {k: v for k, v in run_state.items() if k not in HOST_KEYS}


def run(ctx: context_lib.Context, init_params):
  """GRPO-family training from ``init_params``; resumes from the last checkpoint."""
  cfg = ctx.config.rl
  out_dir = ctx.stage_dir("rl")
  # --- setup -----------------------------------------------------------------------------------
  tx = state_lib.make_optimizer(**state_lib.optimizer_kwargs(cfg))
  critic_graphdef = critic_params = critic_tx = None
  if uses_critic(cfg):
    critic_graphdef, critic_params = critic_lib.build_critic(ctx.graphdef, init_params,
                                                             ctx.config.seed)
    critic_tx = state_lib.make_optimizer(lr=cfg.critic_lr, steps=cfg.steps,
                                         grad_clip=cfg.grad_clip)
  init_params = ctx.placement.place(init_params)
  lcfg = lora_config(cfg)
  trainable = init_params
  if lcfg is not None:  # train adapters; the frozen base is the reference (no copy)
    trainable = modelops.lora.init(init_params, lcfg,
                                   jax.random.fold_in(ctx.key, context_lib.LORA_STREAM))
  run_state = init_run_state(cfg, trainable, tx, critic_params, critic_tx, ctx.placement)
  ref_params = None
  if needs_reference(cfg):
    ref_params = init_params if lcfg is not None else jax.tree.map(jnp.copy, init_params)
  ckpt = ptio.Checkpointer(os.path.join(out_dir, "checkpoints"), max_to_keep=2,
                           async_save=True)
  writer = ptio.MetricWriter(out_dir, tensorboard=ctx.config.get("tensorboard", True),
                             enabled=ctx.is_primary)
  start, elapsed, nonfinite, saved_scheduler, saved_prompts, rollouts = 0, 0.0, 0, None, None, 0.0
  if ckpt.latest_step() is not None:
    arrays, meta = ckpt.restore(_arrays(run_state))
    start, elapsed, nonfinite = meta["step"], meta.get("elapsed", 0.0), meta.get("nonfinite", 0)
    saved_scheduler = meta.get("scheduler")
    saved_prompts, rollouts = meta.get("prompts"), meta.get("rollouts", 0.0)
    run_state = {**arrays, "history_versions": meta.get(
        "history_versions", [max(start - cfg.staleness + i, 0) for i in range(cfg.staleness)])}
    writer.truncate_after(start)
  pieces = RLPieces(ctx, tx, critic_graphdef, critic_tx, run_state=run_state, base=init_params)
  with_scheduler = pieces.scheduler_name != scheduler_lib.NONE
  if with_scheduler and start:  # the schedule continues where the checkpoint left it
    if saved_scheduler is None:
      raise ConfigError(f"rl checkpoint of step {start} holds no state of scheduler "
                        f"{pieces.scheduler_name!r}; it was written with another "
                        "config.rl.scheduler.name (resume with that one or a fresh workdir)")
    scheduler_lib.load(pieces.scheduler, out_dir, start, saved_scheduler)
  if hasattr(pieces.scheduler, "last_events"):  # review: visit events for the repair window
    pieces.event_log = ptio.MetricWriter(out_dir, name=REVIEW_EVENTS, tensorboard=False,
                                         enabled=ctx.is_primary)
    pieces.event_log.truncate_after(start - 1)
  if start and saved_prompts is not None:
    pieces.prompts.load_state_dict(saved_prompts)
  elif start and pieces.prompts.curriculum is not None:
    pieces.prompts.load_state_dict({})  # raises: the checkpoint has no curriculum state
  evaluator = ctx.make_evaluator(cfg.eval_problems, pass_n=0)
  if ctx.heldout_env is not None:  # the held-out env too (generalisation)
    evaluators = (evaluator, ctx.make_evaluator(cfg.eval_problems, pass_n=0, heldout=True))
    evaluator = lambda params, key: {k: v for e in evaluators for k, v in e(params, key).items()}
  run_key = jax.random.fold_in(ctx.key, context_lib.RL_STREAM)
  bar = ptio.Progress(cfg.steps, initial=start, desc="rl", enabled=ctx.show_progress,
                      keys=("reward/mean", "eval/accuracy"))
  if start == 0 and cfg.eval_every:
    writer.write(0, evaluator(pieces.full(run_state["policy"].params), ctx.eval_key))
  producer = None
  settings = async_settings(cfg)
  if settings is not None:  # asynchronous rollouts: generation in a producer thread
    if jax.process_count() > 1:
      raise ConfigError("config.rl.async_rollouts runs on one host; disable it for a "
                        f"{jax.process_count()}-process run")
    async_key = jax.random.fold_in(run_key, ASYNC_STREAM + start)
    producer = async_lib.RolloutProducer(
        lambda params, version, n: batch_lib.generate(ctx, pieces, params, version,
                                                      jax.random.fold_in(async_key, n), start + n),
        **settings)
    producer.publish(jax.tree.map(jnp.copy, run_state["policy"].params),
                     int(run_state["policy"].step))
    producer.start()
  counters = {"start": start, "rollouts": rollouts, "nonfinite": nonfinite,
              "t0": time.time() - elapsed}
  try:
    run_state = _loop(ctx, pieces, run_state, ref_params, run_key, producer, counters,
                      evaluator, (writer, bar, ckpt, out_dir))
  finally:
    if producer is not None:
      producer.stop()
  # --- finish ----------------------------------------------------------------------------------
  bar.close()
  ckpt.close()
  writer.close()
  last = ptio.read_jsonl(writer.path)[-1] if cfg.steps and ctx.is_primary else {}
  final = pieces.full(run_state["policy"].params)  # LoRA: merged into the base, export-ready
  if lcfg is not None:
    last["lora/params"] = modelops.lora.num_params(run_state["policy"].params)
  ctx.save_final("rl", final, {"steps": cfg.steps, **last})
  return final


def _loop(ctx, pieces, run_state, ref_params, run_key, producer, counters, evaluator, outputs):
  """The RL steps from ``counters['start']``: iterate, evaluate, log, checkpoint; returns the
  final run state. ``outputs``: (metric writer, progress bar, checkpointer, stage dir)."""
  cfg = ctx.config.rl
  writer, bar, ckpt, out_dir = outputs
  start, rollouts, nonfinite, t0 = (counters[k] for k in ("start", "rollouts", "nonfinite", "t0"))
  budget = cfg.get("max_rollouts", 0)
  with_scheduler = pieces.scheduler_name != scheduler_lib.NONE
  for step in range(start, cfg.steps):
    if budget and rollouts >= budget:  # equal-rollout comparisons: stop at the budget
      break
    run_state, record = rl_iteration(ctx, pieces, run_state, ref_params,
                                     jax.random.fold_in(run_key, step), step, producer)
    done = step + 1
    rollouts += record["rollouts/generated"]
    record["rollouts/total"] = rollouts
    last = done == cfg.steps or bool(budget and rollouts >= budget)
    nonfinite = nonfinite + 1 if record["train/skipped"] >= cfg.epochs * cfg.minibatches else 0
    if nonfinite >= cfg.max_nonfinite_steps:
      raise context_lib.TrainingError(
          f"rl: loss or gradient non-finite in every update for {nonfinite} steps in a row "
          f"(last at step {done}); lower config.rl.lr or set config.rl.grad_clip")
    if cfg.eval_every and (done % cfg.eval_every == 0 or last):
      record.update(evaluator(pieces.full(run_state["policy"].params), ctx.eval_key))
    record["time/elapsed"] = time.time() - t0
    writer.write(done, record)
    bar.update(record)
    if done % cfg.checkpoint_every == 0 or last:
      meta = {"step": done, "elapsed": record["time/elapsed"], "nonfinite": nonfinite,
              "history_versions": run_state["history_versions"], "rollouts": rollouts,
              "prompts": pieces.prompts.state_dict()}
      if with_scheduler:  # JSON part in the meta, arrays next to the checkpoint (npz)
        meta["scheduler"] = scheduler_lib.save(pieces.scheduler, out_dir, done,
                                               write=ctx.is_primary)
      ckpt.save(done, _arrays(run_state), meta)
  return run_state
