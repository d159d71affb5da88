"""The preference stage's section, ``config.preference`` (train/preference.py)."""

from posttrain_jax.fields import Field, Section, free

PREFERENCE = Section(
  "DPO-family training on preference pairs against the stage's start as the frozen reference "
  "(the preference stage)",
  stage='preference',
  fields=dict(
    average=Field(
      False,
      "the loss sees each completion's mean token log-prob instead of its sum (IPO as TRL feeds it)",
    ),
    b2=Field(0.999, "Adam's β2", kind='decay'),
    batch_size=Field(32, 'pairs per step', kind='count'),
    beta=Field(
      0.1, "the loss's β (DPO, IPO, KTO: the implicit reward's scale; SimPO's β)", kind='positive'
    ),
    checkpoint_every=Field(200, 'steps between checkpoints', kind='count', rerun=False),
    epochs=Field(1, 'passes over the pairs', kind='count0'),
    eval_every=Field(0, 'steps between evaluations (0: at the end only)', kind='count0'),
    eval_problems=Field(200, 'problems per evaluation', kind='count'),
    grad_clip=Field(1.0, 'global-norm gradient clipping (0: off)', kind='nonneg'),
    level=Field(0, "the env level of the env's pairs (0: `env.level`)", kind='count0'),
    loss=Field('dpo', '`objectives.PREFERENCE_LOSSES` name: `dpo`, `ipo`, `simpo` or `kto`'),
    loss_kwargs=free(
      "the loss's other keywords (e.g. `label_smoothing` for dpo, `gamma` for simpo, "
      "`desirable_weight` for kto)"
    ),
    lr=Field(1e-5, 'AdamW learning rate', kind='positive'),
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
    pairs=Field(512, "pairs made from the env's verifier (source 'env')", kind='count'),
    schedule=Field('constant', 'learning-rate schedule after warm-up: `constant` or `cosine`'),
    source=Field(
      'env',
      "`env` (the reference answer against a wrong one the verifier rejects) or a JSONL file of "
      '{"prompt", "chosen", "rejected"} lines',
    ),
    warmup_steps=Field(0, 'linear warm-up steps', kind='count0'),
    weight_decay=Field(0.0, 'AdamW weight decay', kind='nonneg'),
  ),
)
