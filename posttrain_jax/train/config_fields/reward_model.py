"""The reward_model stage's section, ``config.reward_model`` (train/reward_model.py)."""

from posttrain_jax.fields import Field, Section, free  # noqa: F401
from posttrain_jax.train.config_fields.optimizer import optimizer_fields

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
    **optimizer_fields(lr=3e-4, b2=0.99),
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
    margin=Field(
      False, "subtract each pair's `margin` (from the data) from `r_c - r_r` in the loss"
    ),
    max_len=Field(
      0,
      "tokens of prompt + completion + EOS the reward model reads (longer sequences keep their first `max_len - 1` tokens and the EOS); 0: the longest pair's, rounded up to a power of two",
      kind='count0',
    ),
    overrides=free("model field overrides of `reward_model.preset`'s model"),
    pairs=Field(
      2048, 'preference pairs made from the env when `reward_model.data` is empty', kind='count'
    ),
    preset=Field(
      '',
      "the reward model's preset, trained from scratch; '' for the run's model (started from the pretrain stage's final parameters when that stage ran) with a scalar head",
    ),
    steps=Field(300, 'reward-model training steps', kind='count0'),
  ),
)
