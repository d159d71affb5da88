"""Pretraining's section, ``config.pretrain`` (train/pretrain.py)."""

from posttrain_jax.fields import Field, Section, free  # noqa: F401
from posttrain_jax.train.config_fields.optimizer import loop_fields, optimizer_fields

PRETRAIN = Section(
  "next-token training on the env's generated corpus (the pretrain stage)",
  stage='pretrain',
  fields=dict(
    **optimizer_fields(lr=0.001, b2=0.99, warmup_steps=50, weight_decay=0.01),
    **loop_fields(eval_every=100, eval_doc='steps between evaluations'),
    batch_size=Field(128, 'sequences per step', kind='count'),
    corpus_noise=Field(
      0.0,
      "fraction of corpus answers made with the task's systematic mistake (e.g. forgotten carries), in [0, 1]",
      kind='fraction',
    ),
    levels=Field(
      (),
      "levels the corpus is drawn from, in equal shares of every batch (empty: `env.level`), "
      "e.g. `(1, 2, 3)` for a base that has seen a ladder of difficulty",
    ),
    steps=Field(600, 'pretraining steps', kind='count0'),
  ),
)
