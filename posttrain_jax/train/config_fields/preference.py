"""The preference stage's section, ``config.preference`` (train/preference.py)."""

from posttrain_jax.fields import Field, Section, free
from posttrain_jax.train.config_fields.optimizer import loop_fields, optimizer_fields

PREFERENCE = Section(
  "DPO-family training on preference pairs against the stage's start as the frozen reference "
  "(the preference stage)",
  stage='preference',
  fields=dict(
    **optimizer_fields(lr=1e-5),
    **loop_fields(eval_every=0, eval_doc='steps between evaluations (0: at the end only)'),
    average=Field(
      False,
      "the loss sees each completion's mean token log-prob instead of its sum (IPO as TRL feeds it)",
    ),
    batch_size=Field(32, 'pairs per step', kind='count'),
    beta=Field(
      0.1, "the loss's β (DPO, IPO, KTO: the implicit reward's scale; SimPO's β)", kind='positive'
    ),
    epochs=Field(1, 'passes over the pairs', kind='count0'),
    level=Field(0, "the env level of the env's pairs (0: `env.level`)", kind='count0'),
    loss=Field('dpo', '`objectives.PREFERENCE_LOSSES` name: `dpo`, `ipo`, `simpo` or `kto`'),
    loss_kwargs=free(
      "the loss's other keywords (e.g. `label_smoothing` for dpo, `gamma` for simpo, "
      "`desirable_weight` for kto)"
    ),
    pairs=Field(512, "pairs made from the env's verifier (source 'env')", kind='count'),
    source=Field(
      'env',
      "`env` (the reference answer against a wrong one the verifier rejects) or a JSONL file of "
      '{"prompt", "chosen", "rejected"} lines',
    ),
  ),
)
