"""SAVE's section, ``config.rl.save`` (methods/save/, docs/save.md)."""

from posttrain_jax.fields import Field, Section, free  # noqa: F401

SAVE = Section(
  "SAVE's online reward model (methods/save/, docs/save.md)",
  stage='rl',
  fields=dict(
    delta=Field(
      0.0,
      "SAVE's fixed filter threshold on the RM advantage `A = r - V`; 0: `k` x std(A) of the batch ([save.md](save.md))",
      kind='nonneg',
    ),
    enabled=Field(
      False,
      "SAVE: the policy is rewarded by the `reward_model` stage's RM (normalised), which is updated once per step on the step's rollouts; the verifier's reward is only logged ([save.md](save.md))",
    ),
    k=Field(
      0.5, 'the filter threshold `delta = k * std(A)` (used when `delta` is 0)', kind='nonneg'
    ),
    lr=Field(
      1e-05, "the online RM's learning rate (AdamW, the run's `grad_clip`)", kind='positive'
    ),
    mode=Field(
      'save',
      '`save` (filtered within-prompt pairs), `no_filter` (every pair ordered by A), `frozen` (no RM update)',
    ),
    objective=Field(
      'pairs',
      'contrastive loss: `pairs` (within-prompt Bradley-Terry over (positive, negative) pairs) or `anchor` (`-log σ(r+ - V) - log σ(V - r-)`)',
    ),
    offline_batch=Field(
      16, 'stage pairs per step for the offline Bradley-Terry term', kind='count'
    ),
    offline_coef=Field(
      0.0,
      "weight of a Bradley-Terry term on the `reward_model` stage's training pairs (limits drift); 0: off",
      kind='nonneg',
    ),
    path=Field(
      '',
      "the `reward_model` stage to start from: a run's workdir or its `reward_model/final`; empty: this run's",
    ),
    value_coef=Field(
      1.0, 'weight of the value loss `(V(x) - sg(mean_i r(x, y_i)))^2`', kind='nonneg'
    ),
    value_init=Field(
      'reward_head',
      "the value head's start: a copy of the stage's reward head, or `fresh` (normal, std 0.02)",
    ),
  ),
)
