"""Supervised fine-tuning's section, ``config.sft`` (train/sft.py)."""

from posttrain_jax.fields import Field, Section

SFT = Section(
  "supervised fine-tuning on gold solutions from an earlier stage's policy (the sft stage)",
  stage='sft',
  fields=dict(
    b2=Field(0.999, "Adam's β2", kind='decay'),
    batch_size=Field(32, 'examples per step', kind='count'),
    checkpoint_every=Field(200, 'steps between checkpoints', kind='count', rerun=False),
    epochs=Field(1, 'passes over the examples', kind='count0'),
    eval_every=Field(0, 'steps between evaluations (0: at the end only)', kind='count0'),
    eval_problems=Field(200, 'problems per evaluation', kind='count'),
    examples=Field(
      512,
      "gold transcripts drawn from the env (source 'env'); the file's lines otherwise",
      kind='count',
    ),
    grad_clip=Field(1.0, 'global-norm gradient clipping (0: off)', kind='nonneg'),
    level=Field(0, "the env level of the gold transcripts (0: `env.level`)", kind='count0'),
    lr=Field(1e-4, 'AdamW learning rate', kind='positive'),
    max_nonfinite_steps=Field(
      5,
      'stop with an error after this many steps in a row whose update was skipped',
      kind='count',
      rerun=False,
    ),
    max_update_ratio=Field(
      1.0,
      "skip an update whose global norm exceeds this times the parameters' (exploding); 0: no bound",
      kind='nonneg',
    ),
    noise=Field(
      0.0,
      "fraction of the env's transcripts made with the task's systematic mistake, in [0, 1]",
      kind='fraction',
    ),
    schedule=Field('constant', 'learning-rate schedule after warm-up: `constant` or `cosine`'),
    source=Field(
      'env',
      "`env` (the env's gold transcripts) or a JSONL file of "
      '{"prompt": ..., "completion": ...} lines',
    ),
    warmup_steps=Field(0, 'linear warm-up steps', kind='count0'),
    weight_decay=Field(0.0, 'AdamW weight decay', kind='nonneg'),
  ),
)
