"""Supervised fine-tuning's section, ``config.sft`` (train/sft.py)."""

from posttrain_jax.fields import Field, Section
from posttrain_jax.train.config_fields.optimizer import loop_fields, optimizer_fields

SFT = Section(
  "supervised fine-tuning on gold solutions from an earlier stage's policy (the sft stage)",
  stage='sft',
  fields=dict(
    **optimizer_fields(lr=1e-4),
    **loop_fields(eval_every=0, eval_doc='steps between evaluations (0: at the end only)'),
    batch_size=Field(32, 'examples per step', kind='count'),
    epochs=Field(1, 'passes over the examples', kind='count0'),
    examples=Field(
      512,
      "gold transcripts drawn from the env (source 'env'); the file's lines otherwise",
      kind='count',
    ),
    level=Field(0, "the env level of the gold transcripts (0: `env.level`)", kind='count0'),
    noise=Field(
      0.0,
      "fraction of the env's transcripts made with the task's systematic mistake, in [0, 1]",
      kind='fraction',
    ),
    source=Field(
      'env',
      "`env` (the env's gold transcripts) or a JSONL file of "
      '{"prompt": ..., "completion": ...} lines',
    ),
  ),
)
