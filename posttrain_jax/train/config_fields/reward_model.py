"""The reward_model stage's section, ``config.reward_model`` (train/reward_model.py)."""

from posttrain_jax.fields import Field, Section, free  # noqa: F401

REWARD_MODEL = Section(
  'the reward_model stage (train/reward_model.py, docs/reward_models.md)',
  unused=(
    (
      ("reward_model.overrides",),
      lambda c: not c.reward_model.preset,
      "config.reward_model.preset is empty (the reward model is the run's model)",
    ),
    (
      ("reward_model.pairs",),
      lambda c: bool(c.reward_model.data),
      "config.reward_model.data gives the pairs (pairs counts those made from the env)",
    ),
  ),
  stage='reward_model',
  fields=dict(
    b2=Field(0.99, "Adam's β2 of the `reward_model` stage", kind='decay'),
    batch_size=Field(
      32, 'preference pairs per step (each pair is two rows of one forward)', kind='count'
    ),
    center_coef=Field(
      0.01,
      'weight of the centring term `mean((r_c + r_r)^2)` added to the Bradley-Terry loss (keeps rewards near 0); 0: off',
      kind='nonneg',
    ),
    checkpoint_every=Field(
      100, 'reward-model steps between checkpoints', kind='count', rerun=False
    ),
    data=Field(
      '',
      "JSONL file of preference pairs (`prompt`, `chosen`, `rejected`, optional `margin`; TRL's explicit-prompt layout); empty: pairs made from the env (its reference answer over a wrong one); see [reward_models.md](reward_models.md)",
    ),
    eval_every=Field(
      50,
      'steps between held-out evaluations (`eval/accuracy`, `eval/margin`, `eval/reward_mean`, `eval/reward_std`)',
      kind='count',
    ),
    eval_fraction=Field(
      0.1,
      'fraction of the pairs held out (of a file: a seeded shuffle; made from the env: drawn from its eval split); their reward mean / std are stored with the model for normalisation',
      kind='decay',
    ),
    grad_clip=Field(1.0, 'global-norm gradient clipping (0: off)', kind='nonneg'),
    lr=Field(0.0003, 'AdamW learning rate', kind='positive'),
    margin=Field(
      False, "subtract each pair's `margin` (from the data) from `r_c - r_r` in the loss"
    ),
    max_len=Field(
      0,
      "tokens of prompt + completion + EOS the reward model reads (longer sequences keep their first `max_len - 1` tokens and the EOS); 0: the longest pair's, rounded up to a power of two",
      kind='count0',
    ),
    max_nonfinite_steps=Field(
      5,
      'stop with an error after this many steps in a row whose update was skipped (non-finite or exploding)',
      kind='count',
      rerun=False,
    ),
    max_update_ratio=Field(
      1.0,
      "skip an update whose global norm exceeds this times the parameters' (exploding); 0: no bound",
      kind='nonneg',
    ),
    overrides=free("model field overrides of `reward_model.preset`'s model"),
    pairs=Field(
      2048, 'preference pairs made from the env when `reward_model.data` is empty', kind='count'
    ),
    preset=Field(
      '',
      "the reward model's preset, trained from scratch; '' for the run's model (started from the pretrain stage's final parameters when that stage ran) with a scalar head",
    ),
    schedule=Field('constant', 'learning-rate schedule after warm-up: `constant` or `cosine`'),
    steps=Field(300, 'reward-model training steps', kind='count0'),
    warmup_steps=Field(0, 'linear warm-up steps', kind='count0'),
    weight_decay=Field(0.0, 'AdamW weight decay', kind='nonneg'),
  ),
)
