"""The teacher's section, ``config.rl.teacher`` (methods/teacher/, docs/teachers.md)."""

from posttrain_jax.fields import Field, Section, free  # noqa: F401

TEACHER = Section(
  'the teacher of on-policy distillation (methods/teacher/, docs/teachers.md)',
  unused=(
    (
      ("rl.teacher.coef", "rl.teacher.steps", "rl.teacher.pg_during", "rl.teacher.lmbda"),
      lambda c: not c.rl.teacher.loss,
      "config.rl.teacher.loss is empty (no distillation term)",
    ),
    (
      (
        "rl.teacher.preset",
        "rl.teacher.overrides",
        "rl.teacher.pretrain_steps",
        "rl.teacher.pretrain_noise",
      ),
      lambda c: c.rl.teacher.source != "stage",
      "only config.rl.teacher.source='stage' trains a teacher of its own",
    ),
    (
      ("rl.teacher.path",),
      lambda c: c.rl.teacher.source != "path",
      "only config.rl.teacher.source='path' loads a teacher from a folder",
    ),
  ),
  stage='rl',
  fields=dict(
    coef=Field(1.0, 'weight of the distillation term (`distill_coef`)', kind='nonneg'),
    context=Field(
      'none',
      "privileged context in the teacher's prompt only (`envs.CONTEXTS`: `none`, `answer`, `hint_digits`, `feedback`)",
      stage='pretrain',
    ),
    context_kwargs=free(
      "the context's arguments (e.g. `k`, `noise` of `hint_digits`)", stage='pretrain'
    ),
    lmbda=Field(
      1.0,
      "GKD's on-policy fraction: during the distillation phase a step distils on the student's samples with this probability, else on the problems' reference answers (methods/gkd/; needs `pg_during=False`)",
      kind='fraction',
    ),
    loss=Field(
      '',
      "the distillation term by name (`objectives.DIVERGENCES`: `forward`, `reverse`, `jsd`, `k1`, `k2`, `k3`); '' for none",
    ),
    loss_kwargs=free('its arguments (e.g. `beta` of `jsd`)'),
    mesh=Section(
      '',
      fields=dict(
        axes=Field(('data', 'fsdp', 'tensor'), "the teacher mesh's axis names"),
        devices=Field((), 'indices into `jax.devices()` the teacher mesh spans; empty: all'),
        shape=Field(
          (),
          "a mesh of the teacher's own (sources `stage` and `path`): its parameters live there, the rows are sent there and its log-probs come back; empty: the run's mesh",
        ),
      ),
    ),
    overrides=free("model field overrides of the `teacher` stage's model", stage='teacher'),
    path=Field(
      '',
      "source `path`: a run's `STAGE/final` folder or a Hugging Face folder sharing the student's tokenizer",
    ),
    pg_during=Field(
      True, 'the policy loss stays on during the distillation phase (`False`: `pg_coef` 0 then)'
    ),
    preset=Field(
      '', "source `stage`: the teacher's preset ('' for the student's)", stage='teacher'
    ),
    pretrain_context=Field(
      0.0,
      "fraction of pretraining examples whose prompt shows the teacher's context (so a self-teacher can read it)",
      kind='fraction',
      stage='pretrain',
    ),
    pretrain_context_kwargs=free(
      'the context\'s arguments in pretraining ({}: `context_kwargs`; e.g. `{"k": -1}`: hints of random informativeness)',
      stage='pretrain',
    ),
    pretrain_context_name=Field(
      '',
      "the context pretraining shows (`''`: the teacher's `context`), e.g. hints in pretraining for a run whose teacher reads feedback",
    ),
    pretrain_noise=Field(
      0.0,
      'corpus noise of the `teacher` stage (0: a clean corpus, a teacher better than a student pretrained on a noisy one)',
      kind='fraction',
      stage='teacher',
    ),
    pretrain_steps=Field(
      0, 'steps of the `teacher` stage (0: `pretrain.steps`)', kind='count0', stage='teacher'
    ),
    rule=Field(
      'never',
      'refresh of a `start` teacher from the policy (`objectives.refresh_rules.REFRESH_RULES`: `never`, `every`, `ema`, `cgtr`)',
    ),
    rule_kwargs=free(
      "the rule's arguments (`period`, `alpha`; CGTR's `min_isolation`, `delta_r`, `delta_l`, `max_truncation`)"
    ),
    source=Field(
      'start',
      "the teacher: `start` (the RL start; with a rule a refreshed copy), `policy` (the live policy), `stage` (this run's `teacher` stage), `path`",
    ),
    steps=Field(
      0,
      'the distillation phase: the term is on for the first this many RL steps (0: all)',
      kind='count0',
    ),
    temperature=Field(1.0, "the teacher's logits are divided by it", kind='positive'),
  ),
)
