"""The default experiment config every experiment file starts from, and ``arg`` parsing.

``get_config(arg)`` of an experiment file receives the text after ``:`` in
``--config=experiments/NAME.py:ARG``. :func:`parse_arg` reads it big_vision-style:
``"smoke,seed=3"`` -> ``ConfigDict(smoke=True, seed=3)``.
"""

import copy

import ml_collections


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """Parses ``"flag,key=value"`` into a ConfigDict; values take the type of their default."""
  out = ml_collections.ConfigDict(defaults)
  for item in filter(None, (arg or "").split(",")):
    key, _, value = item.partition("=")
    if key not in defaults:
      raise ValueError(f"unknown config arg {key!r}; valid args: {', '.join(sorted(defaults))}")
    if not _:
      out[key] = True
    elif isinstance(defaults[key], bool):
      out[key] = value.lower() in ("1", "true", "yes")
    else:
      out[key] = type(defaults[key])(value)
  return out


def base_config() -> ml_collections.ConfigDict:
  """Every key the pretrain / rl / eval stages read, with defaults."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  # The stages to run, in order (train/stages.py): kinds (pretrain, teacher, reward_model, rl,
  # modelop, eval) or names declared in stage_specs (name -> kind, start, overrides, and op /
  # inputs / kwargs for a modelop), e.g. two RL stages on different envs with an eval after each.
  c.stages = ("pretrain", "rl", "eval")
  c.stage_specs = ml_collections.ConfigDict()
  c.progress = True
  c.tensorboard = True
  # JAX's persistent compilation cache (parallel/compile_cache.py): a rerun loads its compiled
  # programs from here; '' turns it off; $POSTTRAIN_JAX_COMPILATION_CACHE overrides it.
  c.compilation_cache_dir = "~/.cache/posttrain_jax/xla"
  # Whole compiled programs stored under <compilation_cache_dir>/executables
  # (parallel/executables.py; posttrain_jax.main and the benchmarks install the store): a rerun
  # of the same config and code skips tracing and lowering too.
  # $POSTTRAIN_JAX_EXECUTABLE_CACHE=0 turns it off.
  c.executable_cache = True
  # Device mesh over ('data', 'fsdp', 'tensor'); one -1 takes the remaining devices. The
  # default shards parameters FSDP over every device (1x1x1 on one device).
  # devices: the indices (into jax.devices()) the mesh spans; empty: all of them.
  c.mesh = ml_collections.ConfigDict(
    dict(shape=(1, -1, 1), axes=("data", "fsdp", "tensor"), devices=())
  )
  # The samplers' own mesh (rollouts, greedy baselines, evaluation); an empty shape shares the
  # run's mesh. E.g. trainer on device 0 (mesh.devices=(0,), shape (1, 1, 1)) and the sampler's
  # rows over two (shape (2, 1, 1)); the rollouts move to the trainer's rows after sampling.
  c.sampler_mesh = ml_collections.ConfigDict(
    dict(shape=(), axes=("data", "fsdp", "tensor"), devices=())
  )
  # XLA:CPU only: split the host's cores into this many JAX devices (jax_num_cpu_devices; 0:
  # JAX's default of one), so a sampler mesh over them decodes row shards concurrently, one
  # thread each. Applied before JAX starts (posttrain_jax.main / train.run).
  c.cpu_devices = 0
  # Multi-process runs (one process per host): empty = one process, unless the environment
  # sets JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID; auto_detect lets JAX
  # read SLURM / Open MPI / TPU / Kubernetes settings.
  c.distributed = ml_collections.ConfigDict(
    dict(
      coordinator_address="",
      num_processes=0,
      process_id=-1,
      initialization_timeout=300,
      auto_detect=False,
    )
  )
  # env: the task (its eval split gives the held-out problems); dataset: train prompts from a
  # static dataset instead (a .jsonl file or a TFDS array_record dataset directory), in epochs.
  c.env = ml_collections.ConfigDict(dict(name="arithmetic", level=3, dataset=""))
  # model: a preset (+ overrides) trained from scratch, or a local Hugging Face checkpoint
  # folder (hf_path; its tokenizer, optionally its chat template around every env prompt).
  c.model = ml_collections.ConfigDict(
    dict(
      preset="tiny",
      dtype="float32",
      max_seq_len=256,
      overrides=ml_collections.ConfigDict(),
      hf_path="",
      chat_template=False,
      remat=False,
      unroll_layers="auto",
      causal_block=-1,
      attention_impl="auto",
    )
  )
  c.pretrain = ml_collections.ConfigDict(
    dict(
      steps=600,
      batch_size=128,
      lr=1e-3,
      warmup_steps=50,
      schedule="constant",
      weight_decay=0.01,
      grad_clip=1.0,
      b2=0.99,
      corpus_noise=0.0,
      eval_every=100,
      eval_problems=200,
      checkpoint_every=200,
      # An update that is non-finite or larger than max_update_ratio x the parameters (global
      # norms; 0: no bound) is skipped; max_nonfinite_steps skipped steps in a row stop the run.
      max_nonfinite_steps=5,
      max_update_ratio=1.0,
    )
  )
  c.rl = ml_collections.ConfigDict(
    dict(
      steps=200,
      prompts_per_step=16,
      group_size=8,
      lr=1e-4,
      warmup_steps=0,
      schedule="constant",
      weight_decay=0.0,
      grad_clip=1.0,
      b2=0.99,
      temperature=1.0,
      top_k=0,
      top_p=1.0,
      max_new_tokens=8,
      advantage="grpo",
      advantage_kwargs=ml_collections.ConfigDict(),
      policy_loss="ppo_clip",
      policy_loss_kwargs=ml_collections.ConfigDict(),
      aggregation="token_mean",
      norm_length=ml_collections.FieldReference(None, field_type=int),
      kl_coef=0.0,
      kl_estimator="k3",
      entropy_coef=0.0,
      epochs=1,
      minibatches=1,
      # The trainer's forwards run each prompt once for its group (same logits, fewer FLOPs)
      # where the batch layout allows it (train.rl.shared_prefix_group; minibatches then hold
      # whole groups); False: per row.
      shared_prefix=True,
      # The trainer's forwards and the update run on the batch's completion width: the longest
      # completion (EOS included) rounded up to a power of two >= trim_min_length, not the
      # max_new_tokens budget (exact: cut positions are masked; one program per width; off
      # with a prompt scheduler, whose stored rows keep the full width).
      trim_completions=True,
      trim_min_length=16,
      eval_every=50,
      eval_problems=200,
      checkpoint_every=25,
      max_nonfinite_steps=5,
      max_update_ratio=1.0,
      # train-inference mismatch: the sampler's weight copy, its staleness in RL steps, which
      # log-probs PPO treats as "old", and an importance-sampling correction (tis / mis).
      sampler_precision="float32",
      staleness=0,
      old_logprobs="behaviour",
      is_correction="none",
      is_correction_kwargs=ml_collections.ConfigDict(),
      # LoRA (rank > 0): train adapters W + (alpha/rank) A B on the target projections with the
      # base frozen (the reference shares it); the final parameters are merged.
      lora=ml_collections.ConfigDict(
        dict(rank=0, alpha=16.0, targets=("q", "k", "v", "o", "gate", "up", "down"))
      ),
      # Mixture-of-experts models: the sampler records each token's experts and every trainer
      # forward replays them (routing replay, R3); needs num_experts > 0.
      routing_replay=False,
      # KL: in the loss (default) or in the reward; fixed or adaptive coefficient.
      kl_in_reward=False,
      kl_controller="fixed",
      kl_target=0.1,
      kl_horizon=10000.0,
      # With kl_in_reward: -β k_t at every token (REINFORCE++ / PPO shaping) for token-level
      # advantages (gae, reinforce_pp_token), instead of the sum on the last token.
      kl_per_token=False,
      # DCMDP Lagrangian λ (D - δ) with projected dual ascent on λ (lr=0: a fixed λ = lam0);
      # dead_zone: λ grows only on violations; decay: κ shrinks λ while D <= δ.
      dcmdp=ml_collections.ConfigDict(
        dict(enabled=False, delta=0.01, lr=0.05, lam_max=10.0, lam0=0.0, dead_zone=False, decay=0.0)
      ),
      # HPO / A-HPO (policy_loss="hpo"): controller="a_hpo" sets hpo's β each step from the
      # whole batch's advantage signs (momentum m smooths it); group_length_norm normalises by
      # each group's mean length instead of the batch's (needs minibatches=1, token_mean).
      hpo=ml_collections.ConfigDict(
        dict(controller="", beta_min=0.05, rule="ratio", momentum=0.0, group_length_norm=False)
      ),
      # Reward shaping terms by name (objectives.SHAPINGS) -> kwargs, applied in order before
      # the advantage, e.g. {"overlong": {"buffer": 4, "mask_truncated": True}} (DAPO).
      reward_shaping=ml_collections.ConfigDict(),
      # Auxiliary loss by name (objectives.AUX_LOSSES), e.g. "echorl".
      aux_loss="",
      aux_loss_kwargs=ml_collections.ConfigDict(),
      step_delimiters="",
      # Learned critic for advantage="gae": the policy's trunk with a scalar head.
      critic_lr=3e-4,
      critic_updates=1,
      value_clip=0.2,
      # Prompt scheduler by name (scheduling.SCHEDULERS): which prompts, how many rollouts
      # each (cero), stored rollouts trained on again (rollout_replay, group_replay), review.
      scheduler=ml_collections.ConfigDict(dict(name="none", kwargs=ml_collections.ConfigDict())),
      # Online mixed env (env.name 'tron' / 'tron:<bucket>'): per-env level curriculum
      # (envs/curriculum.py): up / down one level when the window's pass rate crosses the
      # thresholds; start=0 starts every env at its easiest level.
      curriculum=ml_collections.ConfigDict(
        dict(
          enabled=False,
          up=0.8,
          down=0.2,
          window=32,
          min_count=16,
          ema_decay=0.9,
          weighting="uniform",
          review=0.0,
          min_weight=0.05,
          start=0,
        )
      ),
      # DAPO dynamic sampling: redraw (same shape) until P groups with a learning signal, at
      # most max_rounds draws; every generated rollout counts in rollouts/generated.
      dynamic_sampling=ml_collections.ConfigDict(dict(enabled=False, max_rounds=4)),
      # Stop RL once this many rollouts were generated (0: no budget; steps still bound it).
      max_rollouts=0,
      # SAVE (methods/save/, docs/save.md): the policy's reward is the reward_model stage's
      # RM (of `path`, '' this run's), normalised, updated once per step on the step's rollouts
      # against a value head (mode 'save' | 'no_filter' | 'frozen'; objective 'pairs' |
      # 'anchor'; delta = k * std(A), or `delta` when > 0); offline_coef > 0 adds the stage's
      # pairs' BT loss on offline_batch pairs. The verifier's reward is only logged.
      save=ml_collections.ConfigDict(
        dict(
          enabled=False,
          path="",
          mode="save",
          objective="pairs",
          k=0.5,
          delta=0.0,
          lr=1e-5,
          value_coef=1.0,
          value_init="reward_head",
          offline_coef=0.0,
          offline_batch=16,
        )
      ),
      # DenoiseRL (methods/denoise/, docs/denoise.md): the last round(fraction * G) rows of each
      # group continue from the first round(rho * k) steps (ending in `boundary`; '' cuts
      # characters) of a wrong answer of the weak model (the teacher stage, source 'stage'),
      # the first wrong one of `tries` samples; mask_prefix False also trains on the prefix
      # (needs old_logprobs='recomputed'); eval_rho: the prefixes of the eval stage's recovery
      # rate (recovery_{before,after}_rl).
      denoise=ml_collections.ConfigDict(
        dict(
          enabled=False,
          fraction=0.5,
          rho=0.3,
          tries=4,
          boundary=";",
          mask_prefix=True,
          eval_rho=0.3,
        )
      ),
      # Asynchronous rollouts (one host): a producer thread generates with the newest published
      # parameters into a queue of queue_size batches while the trainer updates; batches more
      # than max_staleness versions behind the trainer are dropped. Not bitwise reproducible.
      async_rollouts=ml_collections.ConfigDict(dict(enabled=False, queue_size=1, max_staleness=2)),
      # The teacher of on-policy distillation (methods/teacher/; docs/teachers.md). source:
      # 'start' (the RL start, i.e. the reference; with a refresh rule a snapshot or EMA of the
      # policy), 'policy' (the live policy, stop-gradient: self-distillation), 'stage' (this
      # run's `teacher` stage: preset + overrides pretrained for pretrain_steps, 0: as many as
      # config.pretrain.steps) or 'path' (a run's STAGE/final folder or a Hugging Face folder
      # sharing the student's tokenizer). rule: refresh from the policy (REFRESH_RULES: never,
      # every, ema, cgtr). context: privileged text in the teacher's prompt only
      # (envs.CONTEXTS); pretrain_context: the fraction of pretraining examples that show a
      # context: pretrain_context_name ('': the teacher's) with pretrain_context_kwargs ({}:
      # context_kwargs when it is the teacher's).
      # loss: a distillation term (objectives.DIVERGENCES) weighted by coef, on for the first
      # `steps` RL steps (0: all), with the policy loss off meanwhile unless pg_during.
      # lmbda: GKD's on-policy fraction: in that phase, a step distils on the student's samples
      # with probability lmbda, else on the problems' reference answers (methods/gkd/).
      teacher=ml_collections.ConfigDict(
        dict(
          source="start",
          path="",
          preset="",
          overrides=ml_collections.ConfigDict(),
          pretrain_steps=0,
          pretrain_noise=0.0,
          temperature=1.0,
          rule="never",
          rule_kwargs=ml_collections.ConfigDict(),
          context="none",
          context_kwargs=ml_collections.ConfigDict(),
          pretrain_context=0.0,
          pretrain_context_kwargs=ml_collections.ConfigDict(),
          pretrain_context_name="",
          loss="",
          loss_kwargs=ml_collections.ConfigDict(),
          coef=1.0,
          steps=0,
          pg_during=True,
          lmbda=1.0,
          # A mesh of the teacher's own (sources 'stage' and 'path'; shape () = the run's):
          # its parameters live there, the rows go there and its log-probs come back.
          mesh=ml_collections.ConfigDict(
            dict(shape=(), axes=("data", "fsdp", "tensor"), devices=())
          ),
        )
      ),
      # The reference's refresh from the policy (REFRESH_RULES; TRL's sync_ref_model is
      # rule 'every' with kwargs period and alpha).
      ref_rule="never",
      ref_rule_kwargs=ml_collections.ConfigDict(),
    )
  )
  # Reward calls (rewards/calls.py): each env.verify call runs in one of `workers` worker
  # processes with `timeout` seconds (0 workers: in this process, no timeout, for debugging);
  # a call that raises, times out or returns NaN/inf or a non-number scores 0 and is counted
  # (reward/errors/<kind>); more than `max_error_rate` of a step's (or an evaluation's) calls
  # failing stops the run (1.0: never).
  # terms: the reward as a weighted sum (rewards/terms.py): name -> {fn: a REWARDS name,
  # 'module:function' or 'path/file.py:function' (default: the name), weight (1.0), kwargs};
  # the env's verifier is the term 'correct' (weight 1 unless given). Each term is logged as
  # reward/<name>, its failed calls as reward/<name>/errors.
  c.reward = ml_collections.ConfigDict(
    dict(timeout=10.0, workers=2, max_error_rate=0.5, terms=ml_collections.ConfigDict())
  )
  # agent: multi-turn tool-use rollouts (methods/agent/, docs/agents.md) when tools names
  # one: every sampler of the run stops where a row writes </tool>, runs the call in a ToolEnv
  # and feeds the observation back (no loss on it). tools: envs.TOOLS names, 'module:function'
  # or 'path/file.py:function'; tool_kwargs: name -> that tool's options; max_turns: turns per
  # episode (the answer included); max_obs_chars: an observation's text budget; max_obs_tokens:
  # its token budget (0: max_obs_chars plus the tags); max_tool_failures: failed calls that end
  # an episode (0: no cap); tool_timeout_s: seconds per call; buckets: Libra's C-MLFQ
  # (rollout/buckets.py), ((width, quantum, calls[, refill]), ...) levels an episode is demoted
  # through after `calls` tool returns or `quantum` tokens (refill: continuous batching, a
  # freed row takes the next episode); (): each batch runs to its end (FIFO).
  c.agent = ml_collections.ConfigDict(
    dict(
      tools=(),
      tool_kwargs=ml_collections.ConfigDict(),
      max_turns=4,
      max_obs_chars=32,
      max_obs_tokens=0,
      max_tool_failures=0,
      tool_timeout_s=10.0,
      buckets=(),
    )
  )
  # The reward_model stage (when in stages; train/reward_model.py, docs/reward_models.md): a
  # Bradley-Terry reward model on the pairs of `data` (JSONL prompt/chosen/rejected[/margin]),
  # or on `pairs` pairs made from the env ('' data: reference answer over a wrong one).
  # The run's model (from pretraining's final parameters) with a scalar head, or a fresh
  # `preset` (+ overrides). eval_fraction of the pairs held out; center_coef weighs the
  # centring term; margin: subtract the data's margins; max_len 0: the longest pair's.
  c.reward_model = ml_collections.ConfigDict(
    dict(
      data="",
      pairs=2048,
      eval_fraction=0.1,
      steps=300,
      batch_size=32,
      lr=3e-4,
      warmup_steps=0,
      schedule="constant",
      weight_decay=0.0,
      grad_clip=1.0,
      b2=0.99,
      center_coef=0.01,
      margin=False,
      max_len=0,
      preset="",
      overrides=ml_collections.ConfigDict(),
      eval_every=50,
      checkpoint_every=100,
      max_nonfinite_steps=5,
      max_update_ratio=1.0,
    )
  )
  c.eval = ml_collections.ConfigDict(
    dict(
      num_problems=1000,
      batch_size=500,
      pass_k=4,
      pass_n=8,
      pass_problems=250,
      temperature=1.0,
      seed=1234,
      # Weights the evaluation samples with: the trainer's (float32) or a deployed copy.
      precision="float32",
      # RL metric keys summarised into summary.json as rl_mean/KEY, rl_sum/KEY, rl_last/KEY.
      rl_summary=("batch/zero_signal_groups", "rollouts/generated"),
      # A second env evaluated on held-out problems (generalisation), e.g. 'tron/parity';
      # reported as eval/heldout_accuracy and accuracy_heldout_{before,after}_rl.
      heldout_env="",
      heldout_level=0,
      # More envs the eval stage scores greedily at heldout_level (0: env.level), each reported
      # as accuracy_<name>_{before,after}_rl ('/' in a name becomes '_').
      extra_envs=(),
    )
  )
  return c


def complete(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Fills in place every key of :func:`base_config` that ``config`` lacks (its own values
  win; free-form sections such as ``*kwargs`` are not filled). The one place defaults live:
  code after :func:`~posttrain_jax.train.validate.validate` reads keys as attributes."""
  _fill(config, base_config())
  return config


def _fill(section: ml_collections.ConfigDict, base: ml_collections.ConfigDict) -> None:
  for key in base.keys():
    value = base[key]
    if key not in section:
      section[key] = copy.deepcopy(value)
    elif (
      isinstance(value, ml_collections.ConfigDict)
      and not key.endswith(_FREE_FORM)
      and isinstance(section[key], ml_collections.ConfigDict)
    ):
      _fill(section[key], value)


def parse_arm_arg(arg: str | None, arms, default: str) -> ml_collections.ConfigDict:
  """A reproduction config's ``arg`` (``smoke``, ``seed=N``, ``arm=NAME``); an unknown arm
  raises a ValueError listing the valid ones."""
  args = parse_arg(arg, smoke=False, seed=0, arm=default)
  if args.arm not in arms:
    raise ValueError(f"unknown arm {args.arm!r}; valid arms: {', '.join(arms)}")
  return args


def sparse_addition_base(seed: int) -> ml_collections.ConfigDict:
  """:func:`addition_base` with pretraining stopped at 450 steps, before or at the start of the
  accuracy jump, so few rollouts are correct when RL starts. The shared base of the hpo,
  maxpo_sparse, rollout_replay, cero and review reproductions (they reuse its checkpoints)."""
  c = addition_base(seed)
  c.pretrain.update(steps=450, eval_every=150, checkpoint_every=150)
  return c


def addition_base(seed: int) -> ml_collections.ConfigDict:
  """The quickstart's setting: 3-digit addition, tiny model, 1,000 pretraining steps on a
  corpus whose answers forget every carry half of the time, then 16 x 8 GRPO. Reproduction
  configs start from it so they can share the quickstart's pretraining checkpoints."""
  c = base_config()
  c.seed = seed
  c.env.name, c.env.level = "arithmetic", 3
  c.model.preset = "tiny"
  c.pretrain.update(steps=1000, batch_size=128, lr=1e-3, corpus_noise=0.5, eval_every=100)
  c.rl.update(
    steps=200, prompts_per_step=16, group_size=8, lr=1e-4, max_new_tokens=6, eval_every=50
  )
  return c


def make_smoke(
  c: ml_collections.ConfigDict, *, rl_steps: int = 2, group_size: int = 4, pass_k: int = 2
) -> ml_collections.ConfigDict:
  """Shrinks ``c`` in place to a seconds-long run (nano model, a few steps) for tests."""
  c.model.preset = "nano"
  c.tensorboard = False
  c.pretrain.update(steps=4, batch_size=16, eval_every=2, eval_problems=16, checkpoint_every=2)
  c.rl.update(
    steps=rl_steps,
    prompts_per_step=4,
    group_size=group_size,
    eval_every=1,
    eval_problems=16,
    checkpoint_every=2,
  )
  c.eval.update(num_problems=16, batch_size=16, pass_k=pass_k, pass_n=2 * pass_k, pass_problems=8)
  return c


# Config sections whose keys are free-form (a piece's keyword arguments, shaping terms by name):
# an arm replaces them whole instead of updating them key by key.
_FREE_FORM = ("kwargs", "reward_shaping", "stage_specs", "terms")


def apply_arm(section: ml_collections.ConfigDict, overrides: dict) -> None:
  """Sets an arm's ``overrides`` (key -> value) on a config section, e.g. ``c.rl``: a dict
  value updates the sub-section of that name key by key (``{"dcmdp": {"enabled": True}}``),
  except free-form sections (``*kwargs``, ``reward_shaping``), which it replaces whole."""
  for key, value in overrides.items():
    if isinstance(value, dict) and key.endswith(_FREE_FORM):
      section[key] = ml_collections.ConfigDict(value)
    elif isinstance(value, dict):
      if key not in section:
        raise ValueError(f"arm override {key!r}: the config has no section of that name")
      apply_arm(section[key], value)
    else:
      section[key] = value


def sweep(
  *,
  title: str,
  arms,
  baseline: str,
  claim: dict,
  metrics,
  shared_stages=("pretrain",),
  curves=("reward/mean", "eval/accuracy"),
  notes=(),
) -> ml_collections.ConfigDict:
  """A reproduction's ``config.sweep`` (scripts/reproduce.py): its arms (the first metric is the
  claim's unless ``claim['metric']`` says otherwise), the baseline arm of the paired tests, the
  paper's claim (``text``, ``arm``, ``metric``, ``direction`` 'higher' or 'lower') declared
  before the runs, the stages the arms share per seed, the curves to plot and notes."""
  arms = tuple(arms)
  missing = sorted({"text", "arm", "metric", "direction"} - set(claim))
  if missing:
    raise ValueError(f"sweep claim lacks {missing}")
  if baseline not in arms or claim["arm"] not in arms:
    raise ValueError(
      f"sweep baseline {baseline!r} and claim arm {claim['arm']!r} must be arms of {arms}"
    )
  if claim["direction"] not in ("higher", "lower"):
    raise ValueError(
      f"sweep claim direction must be 'higher' or 'lower', got {claim['direction']!r}"
    )
  return ml_collections.ConfigDict(
    dict(
      title=title,
      arms=arms,
      baseline=baseline,
      shared_stages=tuple(shared_stages),
      metrics=tuple(metrics),
      curves=tuple(curves),
      notes=tuple(notes),
      claim=ml_collections.ConfigDict(dict(claim)),
    )
  )
