"""The fields every supervised stage's section shares: its own AdamW optimiser and the loop's
cadences (pretrain, sft, preference)."""

from posttrain_jax.fields import Field


def optimizer_fields(
  *, lr: float, b2: float = 0.999, warmup_steps: int = 0, weight_decay: float = 0.0
) -> dict:
  """AdamW (``lr``, ``b2``, ``weight_decay``), the schedule and warm-up, gradient clipping and
  the skip rules for non-finite or exploding updates, with these defaults."""
  return dict(
    b2=Field(b2, "Adam's β2", kind='decay'),
    grad_clip=Field(1.0, 'global-norm gradient clipping (0: off)', kind='nonneg'),
    lr=Field(lr, 'AdamW learning rate', kind='positive'),
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
    warmup_steps=Field(warmup_steps, 'linear warm-up steps', kind='count0'),
    weight_decay=Field(weight_decay, 'AdamW weight decay', kind='nonneg'),
  )


def loop_fields(*, eval_every: int, eval_doc: str, checkpoint_every: int = 200) -> dict:
  """The loop's cadences: evaluations, their size, checkpoints."""
  return dict(
    checkpoint_every=Field(
      checkpoint_every, 'steps between checkpoints', kind='count', rerun=False
    ),
    eval_every=Field(eval_every, eval_doc, kind='count0' if eval_every == 0 else 'count'),
    eval_problems=Field(200, 'problems per evaluation', kind='count'),
  )
