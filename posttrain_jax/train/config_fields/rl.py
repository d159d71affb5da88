"""The RL stage's section, ``config.rl`` (train/rl.py); the methods' subsections (``rl.teacher``,
``rl.save``, ``rl.denoise``) are declared in their folders (``methods/<name>/fields.py``)."""

from posttrain_jax import objectives
from posttrain_jax.fields import Field, Section, free  # noqa: F401

RL = Section(
  'the RL stage (train/rl.py): sampling, advantages, the loss, its controllers',
  unused=(
    (
      ("rl.kl_estimator", "rl.kl_in_reward", "rl.kl_controller", "rl.kl_per_token"),
      lambda c: not c.rl.kl_coef,
      "config.rl.kl_coef is 0 (no KL term)",
    ),
    (
      ("rl.kl_target", "rl.kl_horizon"),
      lambda c: c.rl.kl_controller != "adaptive",
      "only config.rl.kl_controller='adaptive' reads them",
    ),
    (
      ("rl.critic_lr", "rl.critic_updates", "rl.value_clip"),
      lambda c: "values" not in getattr(objectives.ADVANTAGES.get(c.rl.advantage), "reads", ()),
      "only an advantage that reads critic values (gae) trains a critic",
    ),
    (
      ("rl.trim_min_length",),
      lambda c: not c.rl.trim_completions,
      "config.rl.trim_completions is False",
    ),
  ),
  stage='rl',
  fields=dict(
    advantage=Field('grpo', 'a name of `objectives.ADVANTAGES`'),
    advantage_kwargs=free('its hyperparameters (unknown ones are rejected with the accepted list)'),
    aggregation=Field('token_mean', 'a name of `objectives.AGGREGATIONS`'),
    async_rollouts=Section(
      'asynchronous rollouts: a producer thread generates with the newest parameters (`enabled`, `queue_size`, `max_staleness`)',
      unused=(
        (
          ("rl.async_rollouts.queue_size", "rl.async_rollouts.max_staleness"),
          lambda c: not c.rl.async_rollouts.enabled,
          "config.rl.async_rollouts.enabled is False",
        ),
      ),
      fields=dict(
        enabled=Field(
          False,
          'a producer thread generates with the newest published parameters while the trainer updates (not bitwise reproducible)',
        ),
        max_staleness=Field(
          2, 'batches more than this many versions behind the trainer are dropped', kind='count0'
        ),
        queue_size=Field(1, 'batches the queue holds', kind='count'),
      ),
    ),
    aux_loss=Field(
      '', 'auxiliary loss by name (`objectives.AUX_LOSSES`, e.g. `echorl`); empty: none'
    ),
    aux_loss_kwargs=free('its hyperparameters'),
    b2=Field(0.99, "Adam's β2", kind='decay'),
    checkpoint_every=Field(25, 'RL steps between checkpoints', kind='count', rerun=False),
    critic_lr=Field(
      0.0003, "learning rate of the learned critic (`advantage='gae'`)", kind='positive'
    ),
    critic_updates=Field(1, 'critic updates per RL step', kind='count'),
    curriculum=Section(
      '',
      fields=dict(
        down=Field(
          0.2,
          "move an env's level down when its window's pass rate falls below this",
          kind='fraction',
        ),
        ema_decay=Field(0.9, 'decay of the per-(env, level) running pass rate', kind='open'),
        enabled=Field(
          False, 'per-env level curriculum for a mixed online env (`tron`, `tron:<bucket>`)'
        ),
        min_count=Field(16, 'rewards needed in the window before any move', kind='count'),
        min_weight=Field(0.05, 'floor of the `learnability` weights', kind='nonneg'),
        review=Field(
          0.0,
          "fraction of each env's weight given to the level below its current one",
          kind='decay',
        ),
        start=Field(0, "starting level (0: every env's easiest)", kind='count0'),
        up=Field(
          0.8, "move an env's level up when its window's pass rate exceeds this", kind='fraction'
        ),
        weighting=Field(
          'uniform',
          "`uniform` (every env equal) or `learnability` (p(1−p) of the current level's pass rate)",
        ),
        window=Field(32, 'recent rewards per env the pass rate is taken over', kind='count'),
      ),
    ),
    dcmdp=Section(
      'DCMDP Lagrangian λ(D̂ − δ) with projected dual ascent (`enabled`, `delta`, `delta_from`, `lr`, `lam_max`, `lam0`, `dead_zone`, `decay`)',
      unused=(
        (
          tuple(
            f"rl.dcmdp.{k}"
            for k in ("delta", "delta_from", "lr", "lam_max", "lam0", "dead_zone", "decay")
          ),
          lambda c: not c.rl.dcmdp.enabled,
          "config.rl.dcmdp.enabled is False",
        ),
      ),
      fields=dict(
        dead_zone=Field(False, 'λ grows only while D̂ > δ (no descent below the bound)'),
        decay=Field(0.0, 'κ: λ shrinks by this fraction each step while D̂ ≤ δ', kind='nonneg'),
        delta=Field(0.01, "DCMDP's bound δ on the discrepancy D", kind='nonneg'),
        delta_from=Field(
          'value',
          "where δ comes from: `value` (`delta`) or `first_step` (D̂ of the first RL batch, "
          "measured before any update: the discrepancy the run starts with, methods_A's "
          "suggested tolerance; needs `rl.old_logprobs='recomputed'`)",
        ),
        enabled=Field(False, 'add the DCMDP Lagrangian λ(D − δ) with projected dual ascent on λ'),
        lam0=Field(0.0, 'initial λ (with `lr=0`: a fixed λ)', kind='nonneg'),
        lam_max=Field(10.0, "λ's upper bound", kind='nonneg'),
        lr=Field(0.05, 'dual ascent step on λ (0: fixed λ = `lam0`)', kind='nonneg'),
      ),
    ),
    dynamic_sampling=Section(
      '',
      unused=(
        (
          ("rl.dynamic_sampling.max_rounds",),
          lambda c: not c.rl.dynamic_sampling.enabled,
          "config.rl.dynamic_sampling.enabled is False",
        ),
      ),
      fields=dict(
        enabled=Field(
          False, 'DAPO dynamic sampling: redraw (same shape) until every group has reward variance'
        ),
        max_rounds=Field(4, 'at most this many draws per step', kind='count'),
      ),
    ),
    entropy_coef=Field(0.0, 'entropy bonus coefficient', kind='finite'),
    epochs=Field(1, 'passes over each batch', kind='count'),
    eval_every=Field(50, 'RL steps between evaluations (0: none during RL)', kind='count0'),
    eval_problems=Field(200, 'problems per evaluation during RL', kind='count'),
    grad_clip=Field(1.0, 'global-norm gradient clipping (0: off)', kind='nonneg'),
    group_size=Field(8, 'rollouts per prompt (G)', kind='count'),
    hpo=Section(
      'with `policy_loss="hpo"`: `controller="a_hpo"` sets HPO\'s β each step from the whole batch\'s advantage signs (`beta_min`, `rule` = ratio / fraction, `momentum`); `group_length_norm=True` normalises by each group\'s mean length',
      fields=dict(
        beta_min=Field(0.05, "A-HPO's lower bound on β", kind='prob'),
        controller=Field(
          '',
          "`a_hpo`: set HPO's β each step from the whole batch's advantage signs (with `policy_loss='hpo'`); empty: fixed β",
        ),
        group_length_norm=Field(
          False,
          "normalise by each group's mean length instead of the batch's (needs `minibatches=1`, `token_mean`)",
        ),
        momentum=Field(0.0, "smoothing of A-HPO's β", kind='decay'),
        rule=Field('ratio', "A-HPO's rule: `ratio` or `fraction`"),
      ),
    ),
    is_correction=Field('none', 'a name of `objectives.IS_CORRECTIONS` (`none`, `tis`, `mis`)'),
    is_correction_kwargs=free('its hyperparameters (`level` = token / sequence / geometric, ...)'),
    kl_aggregation=Field(
      'token_mean',
      "how the KL loss term averages its tokens: `token_mean`, or `policy` (with `rl.aggregation`, as verl's actor and TRL do)",
    ),
    kl_bias_correction=Field(
      False,
      "multiply the KL term's per-token estimate by the ratio π/π_old (DeepSeek-V3.2; TRL's `use_bias_correction_kl`, on by default there)",
    ),
    kl_coef=Field(
      0.0, 'KL coefficient β against the frozen reference (0: no reference)', kind='nonneg'
    ),
    kl_controller=Field('fixed', '`fixed` or `adaptive` coefficient'),
    kl_estimator=Field(
      'k3',
      'a name of `objectives.KL_ESTIMATORS` (`k1`, `k2`, `k3`) or `full_forward` / `full_reverse`',
    ),
    kl_estimator_kwargs=free(
      "its hyperparameters (`clamp`: bound k3 / k3+ to [-c, c], verl's convention with c = 10)"
    ),
    kl_horizon=Field(10000.0, "the adaptive controller's horizon", kind='positive'),
    kl_in_reward=Field(False, 'put the KL in the reward instead of the loss'),
    kl_per_token=Field(
      False,
      'with `kl_in_reward`: `-β k_t` at every token (REINFORCE++ / PPO shaping) for token-level advantages (`gae`, `reinforce_pp_token`) instead of the sum on the last token',
    ),
    kl_target=Field(0.1, "the adaptive controller's target KL", kind='positive'),
    lora=Section(
      '',
      unused=(
        (
          ("rl.lora.alpha", "rl.lora.targets"),
          lambda c: not (c.rl.lora and c.rl.lora.rank),
          "config.rl.lora.rank is 0 (full fine-tuning)",
        ),
      ),
      fields=dict(
        alpha=Field(16.0, 'LoRA scale α (adapters `W + (α/r)·A B`)', kind='positive'),
        rank=Field(
          0,
          'LoRA rank r; > 0 trains adapters with the base frozen (the reference shares it); merged at the end',
          kind='count0',
        ),
        targets=Field(('q', 'k', 'v', 'o', 'gate', 'up', 'down'), 'projections that get adapters'),
      ),
    ),
    lr=Field(0.0001, 'AdamW learning rate', kind='positive'),
    max_new_tokens=Field(8, 'generation budget per completion', kind='count', stage='pretrain'),
    max_nonfinite_steps=Field(
      5,
      'stop with an error after this many steps in a row whose every update was skipped (non-finite or exploding)',
      kind='count',
      rerun=False,
    ),
    max_rollouts=Field(
      0, 'stop RL once this many rollouts were generated (0: no budget)', kind='count0'
    ),
    max_update_ratio=Field(
      1.0,
      "skip an update whose global norm exceeds this times the parameters' (exploding); 0: no bound",
      kind='nonneg',
    ),
    minibatches=Field(1, 'minibatches per epoch', kind='count'),
    norm_length=Field(
      None,
      'the constant length of the `seq_mean_token_sum_norm` aggregation (None: `max_new_tokens`)',
      typed=int,
    ),
    old_logprobs=Field(
      'behaviour',
      'PPO\'s "old" log-probs: the sampler\'s (`behaviour`) or `recomputed` by the trainer',
    ),
    pause_after=Field(
      0,
      'end this run after this many RL steps, checkpointed and unfinished (exit 0); a later run with a larger value or 0 continues it exactly as an uninterrupted run (multi-fidelity HPO promotes trials so); 0: run every step',
      kind='count0',
      rerun=False,
    ),
    policy_loss=Field('ppo_clip', 'a name of `objectives.POLICY_LOSSES`'),
    policy_loss_kwargs=free(
      'its hyperparameters (unknown ones are rejected with the accepted list)'
    ),
    prompts_per_step=Field(16, 'prompts per RL step (P)', kind='count'),
    ref_rule=Field(
      'never',
      "refresh of the reference from the policy (`REFRESH_RULES`; TRL's `sync_ref_model` is `every` with `period` and `alpha`)",
    ),
    ref_rule_kwargs=free('its arguments'),
    reward_shaping=free(
      'shaping terms by name (`objectives.SHAPINGS`) -> kwargs, applied in order before the advantage, e.g. `{"overlong": {"buffer": 4, "mask_truncated": True}}` (DAPO\'s soft overlong penalty and overlong filtering)'
    ),
    routing_replay=Field(
      False,
      "MoE models: the sampler records each token's experts and every trainer forward replays them (R3); needs `num_experts > 0`",
    ),
    sampler_precision=Field(
      'float32',
      "the sampler's weight copy: `float32`, `bfloat16` or fake `int8` / `int4` (`rollout.PRECISIONS`)",
    ),
    schedule=Field('constant', 'learning-rate schedule after warm-up: `constant` or `cosine`'),
    scheduler=Section(
      'who gets rollouts (`name`, `kwargs`): `none` / `uniform` (fixed G), `cero` (Beta-posterior allocation with budget and prompt duals; variable group sizes padded with a row mask), `rollout_replay` (age-capped, \\|A\\|-prioritised, fresh-anchored), `group_replay`, `review` (retention-aware review inside a repair window), `uniform_review`; scheduler state is checkpointed and resumes to the same schedule',
      fields=dict(
        kwargs=free("the scheduler's keyword arguments"),
        name=Field('none', 'prompt scheduler by name (`scheduling.SCHEDULERS`)'),
      ),
    ),
    shared_prefix=Field(
      True,
      "the trainer's forwards and the sampler's prefill run each prompt once for its group where the batch layout allows; `False`: per row",
    ),
    staleness=Field(0, 'rollouts from parameters this many RL steps old', kind='count0'),
    step_delimiters=Field('', 'characters that end a reasoning step (EchoRL clips)'),
    steps=Field(200, 'RL steps', kind='count0'),
    temperature=Field(1.0, 'sampling temperature', kind='positive'),
    top_k=Field(0, 'top-k sampling (0: off)', kind='count0'),
    top_p=Field(1.0, 'top-p sampling (1.0: off)', kind='prob'),
    trim_completions=Field(
      True,
      "run the trainer's forwards and the update on the batch's completion width, not the budget (exact; off with a prompt scheduler)",
    ),
    trim_min_length=Field(
      16, 'smallest trimmed width (widths are powers of two ≥ this)', kind='count'
    ),
    value_clip=Field(0.2, "the critic's value-loss clip", kind='positive'),
    warmup_steps=Field(0, 'linear warm-up steps', kind='count0'),
    weight_decay=Field(0.0, 'AdamW weight decay', kind='nonneg'),
  ),
)
