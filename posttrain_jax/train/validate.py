"""Config validation: every mistake becomes one ConfigError naming the key and the fix."""

import inspect
import os

import numpy as np

from posttrain_jax import envs, modelops, models, objectives, parallel, rewards, rollout, scheduling
from posttrain_jax.envs import curriculum as curriculum_lib
from posttrain_jax.objectives import refresh_rules
from posttrain_jax.registry import ConfigError
from posttrain_jax.train import config_ranges, configs, hooks
from posttrain_jax.train import inputs as inputs_lib
from posttrain_jax.train import prompts as prompts_lib
from posttrain_jax.train import scheduler as scheduler_lib
from posttrain_jax.train import stages as stages_lib
from posttrain_jax.train.state import UNROLL_CHOICES

SCHEDULES = {"constant": 0, "cosine": 0}  # learning-rate schedules of state.make_optimizer


def _require(cond: bool, msg: str) -> None:
  if not cond:
    raise ConfigError(msg)


def _check_name(registry: dict, name: str, key: str) -> None:
  _require(
    name in registry,
    f"config.{key}={name!r} is unknown; valid names: {', '.join(sorted(registry))}",
  )


def _check_kwargs(fn, kwargs, key: str) -> None:
  params = inspect.signature(fn).parameters
  if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
    return
  accepted = {n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
  bad = sorted(set(kwargs) - accepted)
  _require(
    not bad,
    f"config.{key} has unknown argument(s) {bad}; "
    f"{fn.__name__} accepts: {', '.join(sorted(accepted))}",
  )
  for name, valid in getattr(fn, "choices", {}).items():
    _require(
      name not in kwargs or kwargs[name] in valid,
      f"config.{key}.{name}={kwargs.get(name)!r} is unknown; valid: {', '.join(valid)}",
    )


def validate(config, *, methods: tuple) -> None:
  """Raises ConfigError on the first problem found in ``config``; the active methods of
  ``methods`` (the METHODS table) check their own sections last. Each stage with overrides
  (config.stage_specs, train/stages.py) is checked with its own config too."""
  for section in ("env", "model", "pretrain", "rl", "eval"):
    _require(
      section in config, f"config has no '{section}' section; start from experiments/quickstart.py"
    )
  root = hooks.config_root(methods)  # the engine's sections and the methods'
  configs.complete(config, root)  # every later read is an attribute: no default restated
  config_ranges.check_numbers(config, root)
  plan = stages_lib.plan(config)
  _validate_one(config, methods)
  for stage in plan:
    if stage.config is not config:
      try:
        config_ranges.check_numbers(stage.config, root)
        _validate_one(stage.config, methods)
      except ConfigError as e:
        raise ConfigError(
          f"stage {stage.name} (config.stage_specs.{stage.name}.overrides): {e}"
        ) from None
  config_ranges.warn_unused(config, root)


def _validate_one(config, methods: tuple) -> None:
  """The checks of one stage's config (the run's, or a stage's with its overrides)."""
  stages = tuple(config.stages)
  _check_name(envs.ENVS, config.env.name, "env.name")
  env = envs.ENVS[config.env.name]
  _require(
    config.env.level in env.levels,
    f"config.env.level={config.env.level} is not a level of {config.env.name}; "
    f"valid levels: {list(env.levels)}",
  )
  bad = [lv for lv in tuple(config.pretrain.levels) if lv not in env.levels]
  _require(
    not bad,
    f"config.pretrain.levels has {bad}, not levels of {config.env.name}; "
    f"valid levels: {list(env.levels)}",
  )
  _require(
    isinstance(config.compilation_cache_dir, str),
    "config.compilation_cache_dir must be a folder path (a string; '' turns the "
    "persistent compilation cache off)",
  )
  _require(
    isinstance(config.executable_cache, bool),
    "config.executable_cache must be True or False (whether a rerun loads its stored "
    "compiled programs; parallel/executables.py)",
  )
  for stage in ("pretrain", "sft", "preference", "rl", "reward_model"):
    _check_name(SCHEDULES, config[stage].schedule, f"{stage}.schedule")
  _check_name(objectives.PREFERENCE_LOSSES, config.preference.loss, "preference.loss")
  _check_kwargs(
    objectives.PREFERENCE_LOSSES[config.preference.loss],
    dict(config.preference.loss_kwargs),
    "preference.loss_kwargs",
  )
  _check_name(objectives.CONSOLIDATIONS, config.search.rule, "search.rule")
  _check_kwargs(
    objectives.CONSOLIDATIONS[config.search.rule],
    dict(config.search.rule_kwargs),
    "search.rule_kwargs",
  )
  _require(
    config.search.population % 2 == 0
    and all(a > 0 for a in config.search.alphas)
    and config.search.alphas,
    f"config.search.population ({config.search.population}) must be even (antithetic pairs) "
    f"and config.search.alphas ({tuple(config.search.alphas)}) positive step sizes",
  )
  _validate_model(config.model)
  _validate_reward(config.reward)
  hooks.run_checks(methods, config)  # the active methods' own sections
  _validate_reward_model(config.reward_model, "reward_model" in stages)
  made = set(hooks.producers(methods, config))  # fields the active methods make
  _validate_rl(config.rl, made)
  _validate_sources(config)
  _validate_routing_replay(config)
  if "mesh" in config:
    _validate_mesh(config.mesh)
  if config.get("sampler_mesh", None) is not None and tuple(
    config.sampler_mesh.get("shape", ()) or ()
  ):
    _validate_mesh(config.sampler_mesh, "config.sampler_mesh")
  if "distributed" in config:
    _validate_distributed(config.distributed)
  ev = config.eval
  _check_name({n: 0 for n in rollout.PRECISIONS}, ev.precision, "eval.precision")
  _require(
    ev.pass_n >= ev.pass_k,
    f"config.eval.pass_n={ev.pass_n} must be >= "
    f"config.eval.pass_k={ev.pass_k} for an unbiased pass@k",
  )


def _validate_reward(reward) -> None:
  """Beyond the range of config_ranges: a finite timeout (workers=0: none is enforced); each
  of ``reward.terms`` names a function that exists, with a finite weight."""
  _require(
    reward.timeout < float("inf"),
    f"config.reward.timeout must be a finite number of seconds (config.reward.workers=0 "
    f"scores without a timeout), got {reward.timeout!r}",
  )
  rewards.terms.parse(reward.get("terms", None))


def _validate_reward_model(section, staged: bool) -> None:
  """The reward_model stage's preset and pairs file (checked when the stage is to run)."""
  if section.preset:
    _check_name(models.PRESETS, section.preset, "reward_model.preset")
  if staged and section.data:
    _require(
      os.path.isfile(section.data),
      f"config.reward_model.data={section.data!r}: no such file; give a JSONL file of "
      "{'prompt', 'chosen', 'rejected'} objects, or '' for pairs made from the env",
    )


def _validate_rl(rl, made: set) -> None:
  _check_name(objectives.ADVANTAGES, rl.advantage, "rl.advantage")
  refresh_rules.check_setting("config.rl.ref_rule", rl.ref_rule, dict(rl.ref_rule_kwargs))
  _require(not (rl.lora and rl.lora.rank and rl.ref_rule != "never"), refresh_rules.LORA_MESSAGE)
  _check_name(objectives.POLICY_LOSSES, rl.policy_loss, "rl.policy_loss")
  _check_name(objectives.AGGREGATIONS, rl.aggregation, "rl.aggregation")
  kl_names = {**objectives.KL_ESTIMATORS, "full_forward": None, "full_reverse": None}
  _check_name(kl_names, rl.kl_estimator, "rl.kl_estimator")
  _require(
    not (rl.kl_in_reward and rl.kl_estimator.startswith("full_")),
    f"config.rl.kl_in_reward needs a sampled estimator (k1, k2, k3, ...), not {rl.kl_estimator!r}",
  )
  if rl.kl_estimator in objectives.KL_ESTIMATORS:
    _check_kwargs(
      objectives.KL_ESTIMATORS[rl.kl_estimator],
      dict(rl.kl_estimator_kwargs),
      "rl.kl_estimator_kwargs",
    )
  else:
    _require(
      not rl.kl_estimator_kwargs,
      f"config.rl.kl_estimator_kwargs is set but {rl.kl_estimator!r} takes no keywords; "
      "remove them",
    )
  _check_name({"token_mean": 0, "policy": 0}, rl.kl_aggregation, "rl.kl_aggregation")
  _check_name({"fixed": 0, "adaptive": 0}, rl.kl_controller, "rl.kl_controller")
  if rl.kl_per_token:
    _require(
      rl.kl_coef and rl.kl_in_reward,
      "config.rl.kl_per_token spreads the KL in the reward over the tokens; it needs "
      "config.rl.kl_in_reward=True and config.rl.kl_coef > 0",
    )
    _require(
      "token_rewards" in getattr(objectives.ADVANTAGES.get(rl.advantage), "reads", ()),
      f"config.rl.kl_per_token changes only token-level advantages (those reading token "
      f"rewards: gae, reinforce_pp_token); advantage {rl.advantage!r} sees the sequence "
      "sum either way (unset kl_per_token or pick a token-level advantage)",
    )
  _check_name(objectives.IS_CORRECTIONS, rl.is_correction, "rl.is_correction")
  _check_kwargs(
    objectives.IS_CORRECTIONS[rl.is_correction],
    dict(rl.is_correction_kwargs),
    "rl.is_correction_kwargs",
  )
  _check_name({n: 0 for n in rollout.PRECISIONS}, rl.sampler_precision, "rl.sampler_precision")
  _check_name({"behaviour": 0, "recomputed": 0}, rl.old_logprobs, "rl.old_logprobs")
  _require(
    isinstance(rl.shared_prefix, bool),
    f"config.rl.shared_prefix must be True or False, got {rl.shared_prefix!r}",
  )
  _require(
    isinstance(rl.trim_completions, bool),
    f"config.rl.trim_completions must be True or False, got {rl.trim_completions!r}",
  )
  if rl.aux_loss:
    _check_name(objectives.AUX_LOSSES, rl.aux_loss, "rl.aux_loss")
    _require(
      "step_end" not in getattr(objectives.AUX_LOSSES[rl.aux_loss], "reads", ())
      or bool(rl.step_delimiters),
      f"config.rl.aux_loss={rl.aux_loss!r} works on reasoning steps, but "
      "config.rl.step_delimiters is empty, so the whole response would be one step; set "
      "the characters that end a step (e.g. step_delimiters='\\n' for line-per-step "
      "reasoning, or the env's separators such as '+=')",
    )
    _check_kwargs(
      objectives.AUX_LOSSES[rl.aux_loss], dict(rl.aux_loss_kwargs), "rl.aux_loss_kwargs"
    )
  _check_kwargs(
    objectives.ADVANTAGES[rl.advantage], dict(rl.advantage_kwargs), "rl.advantage_kwargs"
  )
  _validate_shaping(rl)
  _validate_inputs(rl, made)
  _check_kwargs(
    objectives.POLICY_LOSSES[rl.policy_loss], dict(rl.policy_loss_kwargs), "rl.policy_loss_kwargs"
  )
  rows = rl.prompts_per_step * rl.group_size
  _require(
    rows % rl.minibatches == 0,
    f"config.rl.minibatches={rl.minibatches} must divide prompts_per_step x group_size = {rows}",
  )
  _require(
    not rl.dcmdp.enabled or 0 <= rl.dcmdp.lam0 <= rl.dcmdp.lam_max,
    f"config.rl.dcmdp.lam0={rl.dcmdp.lam0} must lie in [0, lam_max={rl.dcmdp.lam_max}] "
    "(the dual update clips λ to that range)",
  )
  if rl.dcmdp.enabled:
    _check_name({"value": 0, "first_step": 0}, rl.dcmdp.delta_from, "rl.dcmdp.delta_from")
    _require(
      rl.dcmdp.delta_from != "first_step" or rl.old_logprobs == "recomputed",
      "config.rl.dcmdp.delta_from='first_step' measures D̂ from the trainer's recomputed "
      "log-probs; set config.rl.old_logprobs='recomputed'",
    )
  _validate_hpo(rl)
  _validate_lora(rl)
  _validate_scheduler(rl)


def _validate_shaping(rl) -> None:
  """Each ``rl.reward_shaping`` term: a known name, its kwargs, and one call on a dummy row
  (a term's own range checks become ConfigErrors)."""
  for name, kwargs in rl.reward_shaping.items():
    key = f"rl.reward_shaping.{name}"
    _check_name(objectives.SHAPINGS, name, "rl.reward_shaping")
    kwargs = dict(kwargs)
    _check_kwargs(objectives.SHAPINGS[name], kwargs, key)
    dummy = objectives.ShapingInputs(
      np.ones(1, np.int32),
      np.zeros(1, bool),
      rl.max_new_tokens,
      np.zeros((1, 1), np.float32),
      np.ones((1, 1), np.float32),
      np.zeros((1, 1), np.float32),
    )
    try:
      objectives.SHAPINGS[name](np.zeros(1, np.float32), dummy, **kwargs)
    except (ValueError, TypeError) as e:
      raise ConfigError(f"config.{key}: {e}") from None


def _validate_inputs(rl, made: set) -> None:
  """Every field the selected pieces read has a producer (train/inputs.py, or ``made`` by an
  active method)."""
  for kind, registry_, name in (
    ("advantage", objectives.ADVANTAGES, rl.advantage),
    ("policy_loss", objectives.POLICY_LOSSES, rl.policy_loss),
  ):
    reads = getattr(registry_[name], "reads", frozenset())
    known = set(inputs_lib.PRODUCERS) | set(inputs_lib.OPTIONAL) | made
    missing = sorted(set(reads) - known)
    _require(
      not missing,
      f"config.rl.{kind}={name!r} reads {missing}, which no producer in "
      "train/inputs.py or an active method makes; add one to inputs.PRODUCERS or to the "
      "method's producers",
    )


def _validate_sources(config) -> None:
  """config.env.dataset, config.rl.curriculum / dynamic_sampling / max_rollouts and
  config.eval.heldout_env: clear errors before any stage starts."""
  rl, ev = config.rl, config.eval
  path = config.env.dataset
  if path:
    _require(
      os.path.exists(path),
      f"config.env.dataset={path!r} does not exist; give a .jsonl "
      "file or a TFDS dataset directory (envs.static.write_dataset "
      "/ write_tfds_dataset make one)",
    )
  section = rl.curriculum
  if section is not None and section.enabled:
    env = envs.ENVS[config.env.name]
    _require(
      hasattr(env, "env_levels"),
      f"config.rl.curriculum needs a mixed online env (env.name 'tron' or "
      f"'tron:<bucket>'); {config.env.name!r} is a single env",
    )
    _require(
      not path,
      "config.rl.curriculum draws from an online env; it cannot be combined "
      "with config.env.dataset (unset one of them)",
    )
    kwargs = prompts_lib.curriculum_kwargs(rl)
    start = kwargs.pop("start", 0)
    try:
      curriculum_lib.init(env.env_levels(), start=start or None, **kwargs)
    except (TypeError, ValueError) as e:
      raise ConfigError(f"config.rl.curriculum: {e}") from None
  _validate_concurrency(rl)
  name = ev.heldout_env
  if name:
    _check_name(envs.ENVS, name, "eval.heldout_env")
  _require(
    isinstance(ev.extra_envs, (tuple, list)),
    f"config.eval.extra_envs must be a tuple of env names, got {ev.extra_envs!r}",
  )
  for extra in ev.extra_envs:
    _check_name(envs.ENVS, extra, "eval.extra_envs")
  _require(
    not ev.welfare or config.env.name in ("welfare", "welfare_shuffled"),
    f"config.eval.welfare reads the welfare env's corpus and maze; env.name is "
    f"{config.env.name!r} (set env.name='welfare' or eval.welfare=False)",
  )
  if ev.lara_seen:
    for key in ("lara_seen", "lara_unseen", "lara_reference"):
      _require(
        bool(ev[key]) and os.path.isfile(ev[key]),
        f"config.eval.{key}={ev[key]!r} is no file; LaRA needs three JSONL files of problems: "
        "the trained-on items (lara_seen), never-seen ones (lara_unseen) and a clean reference "
        "(lara_reference)",
      )
    _require(
      hasattr(envs.ENVS.get(config.env.name), "variants"),
      f"config.eval.lara_seen: env {config.env.name!r} has no variants(problem), the "
      "information-removed and paraphrased prompts LaRA perturbs with (arithmetic has them)",
    )


def _validate_concurrency(rl) -> None:
  """DAPO dynamic sampling and asynchronous rollouts: the layouts they need."""
  name = scheduler_lib.name_of(rl)
  dynamic = rl.dynamic_sampling
  if dynamic.enabled:
    _require(
      name in (scheduler_lib.NONE, "uniform"),
      "config.rl.dynamic_sampling refills whole groups of a fixed size; it cannot be "
      f"combined with scheduler {name!r} (set config.rl.scheduler.name='none' or disable "
      "dynamic sampling)",
    )
  section = rl.async_rollouts
  if not section.enabled:
    return
  _require(
    name in (scheduler_lib.NONE, "uniform"),
    "config.rl.async_rollouts generates in a background thread; the prompt scheduler "
    f"{name!r} keeps state the trainer also updates (set config.rl.scheduler.name='none' "
    "or disable async_rollouts)",
  )
  _require(
    not rl.staleness,
    "config.rl.async_rollouts replaces the synchronous config.rl.staleness queue; set "
    "config.rl.staleness=0 and bound the lag with config.rl.async_rollouts.max_staleness",
  )


def _validate_scheduler(rl) -> None:
  section = rl.scheduler
  if section is None:
    return
  _check_name(scheduling.SCHEDULERS, section.name, "rl.scheduler.name")
  kwargs = section.kwargs.to_dict()
  try:
    sched = scheduling.make(section.name, group_size=rl.group_size, **kwargs)
  except TypeError as e:
    raise ConfigError(
      f"config.rl.scheduler.kwargs {sorted(kwargs)} do not fit scheduler {section.name!r}: {e}"
    ) from None
  except ValueError as e:
    raise ConfigError(f"config.rl.scheduler.kwargs: {e}") from None
  rows = scheduler_lib.gen_rows(sched, rl.prompts_per_step) + scheduler_lib.replay_rows(
    sched, rl.prompts_per_step
  )
  _require(
    rows % rl.minibatches == 0,
    f"config.rl.minibatches={rl.minibatches} must divide the {rows} train rows of "
    f"scheduler {section.name!r} (generation rows plus replayed rows)",
  )
  if section.name in scheduler_lib.REPLAY:
    _require(
      not rl.hpo.group_length_norm and not rl.aux_loss,
      f"config.rl.scheduler.name={section.name!r} appends replayed rows of earlier "
      "batches whose group ids are not this batch's; group-aware loss terms "
      "(rl.hpo.group_length_norm, rl.aux_loss) need scheduler 'none' or a non-replay one",
    )


def _validate_hpo(rl) -> None:
  hpo = rl.hpo
  _check_name({"": 0, "a_hpo": 0}, hpo.controller, "rl.hpo.controller")
  _check_name({"ratio": 0, "fraction": 0}, hpo.rule, "rl.hpo.rule")
  _require(
    not hpo.controller or rl.policy_loss == "hpo",
    f"config.rl.hpo.controller={hpo.controller!r} sets the β of policy_loss='hpo', but "
    f"config.rl.policy_loss={rl.policy_loss!r}; set policy_loss='hpo' (the 'a_hpo' loss "
    "computes β per minibatch itself and needs no controller)",
  )
  _require(
    not (hpo.controller and "beta" in rl.policy_loss_kwargs),
    "config.rl.policy_loss_kwargs.beta is set but config.rl.hpo.controller overrides it "
    "every step; drop one of the two",
  )
  if hpo.group_length_norm:
    _require(
      rl.policy_loss in ("hpo", "a_hpo"),
      "config.rl.hpo.group_length_norm applies to policy_loss 'hpo' or 'a_hpo', not "
      f"{rl.policy_loss!r}",
    )
    _require(
      rl.aggregation == "token_mean" and rl.minibatches == 1,
      "config.rl.hpo.group_length_norm needs whole groups in every update: set "
      "config.rl.minibatches=1 and config.rl.aggregation='token_mean' (the group "
      "normalisation replaces the aggregation)",
    )


def _validate_mesh(mesh, name: str = "config.mesh") -> None:
  shape, axes = tuple(mesh.shape), tuple(mesh.axes)
  _require(
    len(shape) == len(axes) and len(axes) > 0,
    f"{name}.shape={shape} needs one size per axis of {name}.axes={axes}",
  )
  known = parallel.MESH_AXES + parallel.OPTIONAL_AXES
  bad = [a for a in axes if a not in known]
  _require(
    not bad and len(set(axes)) == len(axes),
    f"{name}.axes={axes} must be distinct names among {known}",
  )
  _require(
    all(isinstance(s, int) and (s >= 1 or s == -1) for s in shape),
    f"{name}.shape={shape} must hold positive sizes and at most one -1 ('the remaining devices')",
  )
  _require(
    shape.count(-1) <= 1,
    f"{name}.shape={shape} has {shape.count(-1)} entries of -1; at most one axis "
    "can take 'the remaining devices'",
  )
  devices = tuple(mesh.get("devices", ()) or ())
  _require(
    all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices)
    and len(set(devices)) == len(devices),
    f"{name}.devices={devices} must be distinct device indices >= 0 (empty: all devices)",
  )


def _validate_distributed(dist) -> None:
  try:
    parallel.distributed_settings(dist.coordinator_address, dist.num_processes, dist.process_id)
  except ValueError as e:
    raise ConfigError(f"config.distributed: {e}") from None


def _validate_model(model) -> None:
  _check_name({n: 0 for n in UNROLL_CHOICES}, model.unroll_layers, "model.unroll_layers")
  _check_name(
    {n: 0 for n in models.config.ATTENTION_IMPLS}, model.attention_impl, "model.attention_impl"
  )
  _require(
    model.causal_block >= -1,
    f"config.model.causal_block={model.causal_block}; use -1 (auto: 64 on CPU), "
    "0 (one dense attention product) or a query block size",
  )
  hf_path = model.hf_path
  if not hf_path:
    _require(
      not model.chat_template,
      "config.model.chat_template needs a Hugging Face tokenizer: set config.model.hf_path",
    )
    _check_name(models.PRESETS, model.preset, "model.preset")
    try:
      models.preset(model.preset, **dict(model.overrides))
    except ValueError as e:
      raise ConfigError(f"config.model: {e}") from None
    return
  _require(
    os.path.isfile(os.path.join(hf_path, "config.json")),
    f"config.model.hf_path={hf_path!r} is not a Hugging Face checkpoint folder (no "
    "config.json there); point it at a local folder saved by save_pretrained",
  )
  try:
    models.hf.load_config(hf_path, dtype=model.dtype)
  except (ValueError, OSError) as e:
    raise ConfigError(f"config.model.hf_path={hf_path!r}: {e}") from None


def _validate_routing_replay(config) -> None:
  if not config.rl.routing_replay:
    return
  model = config.model
  hf_path = model.hf_path
  if hf_path:
    model_config = models.hf.load_config(hf_path, dtype=model.dtype)
  else:
    model_config = models.preset(model.preset, **dict(model.overrides))
  _require(
    model_config.num_experts > 0,
    "config.rl.routing_replay replays the experts a mixture-of-experts model routed each "
    f"token to, but the model is dense (num_experts={model_config.num_experts}); set "
    "config.rl.routing_replay=False or use an MoE model (e.g. model.preset='nano_moe', "
    "or overrides num_experts > 0)",
  )


def _validate_lora(rl) -> None:
  lora = rl.lora
  if not lora:
    return
  if lora.rank:
    try:
      modelops.LoraConfig(rank=lora.rank, alpha=lora.alpha, targets=tuple(lora.targets))
    except ValueError as e:
      raise ConfigError(f"config.rl.lora: {e}") from None
