"""Pretraining's section, ``config.pretrain`` (train/pretrain.py)."""

from posttrain_jax.fields import Field, Section, free  # noqa: F401

PRETRAIN = Section(
  "next-token training on the env's generated corpus (the pretrain stage)",
  stage='pretrain',
  fields=dict(
    b2=Field(0.99, "Adam's β2", kind='decay'),
    batch_size=Field(128, 'sequences per step', kind='count'),
    checkpoint_every=Field(200, 'steps between checkpoints', kind='count', rerun=False),
    corpus_noise=Field(
      0.0,
      "fraction of corpus answers made with the task's systematic mistake (e.g. forgotten carries), in [0, 1]",
      kind='fraction',
    ),
    eval_every=Field(100, 'steps between evaluations', kind='count'),
    eval_problems=Field(200, 'problems per evaluation', kind='count'),
    grad_clip=Field(1.0, 'global-norm gradient clipping (0: off)', kind='nonneg'),
    levels=Field(
      (),
      "levels the corpus is drawn from, in equal shares of every batch (empty: `env.level`), "
      "e.g. `(1, 2, 3)` for a base that has seen a ladder of difficulty",
    ),
    lr=Field(0.001, 'AdamW learning rate', kind='positive'),
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
    schedule=Field('constant', 'learning-rate schedule after warm-up: `constant` or `cosine`'),
    steps=Field(600, 'pretraining steps', kind='count0'),
    warmup_steps=Field(50, 'linear warm-up steps', kind='count0'),
    weight_decay=Field(0.01, 'AdamW weight decay', kind='nonneg'),
  ),
)
