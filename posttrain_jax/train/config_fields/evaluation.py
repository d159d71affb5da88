"""The eval stage's section, ``config.eval`` (train/eval_stage.py, train/evaluate.py)."""

from posttrain_jax.fields import Field, Section, free  # noqa: F401

EVAL = Section(
  "the eval stage and the RL stage's periodic evaluation",
  unused=(
    (
      ("eval.welfare_alpha", "eval.welfare_examples", "eval.welfare_layer"),
      lambda c: not c.eval.welfare,
      "config.eval.welfare is False",
    ),
    (
      ("eval.lara_unseen", "eval.lara_reference"),
      lambda c: not c.eval.lara_seen,
      "config.eval.lara_seen is empty",
    ),
    (
      ("eval.sveb_continuations", "eval.sveb_cuts", "eval.sveb_group", "eval.sveb_prompts"),
      lambda c: not c.eval.sveb,
      "config.eval.sveb is False",
    ),
    (
      ("eval.heldout_level",),
      lambda c: not c.eval.heldout_env and not tuple(c.eval.extra_envs),
      "config.eval.heldout_env and config.eval.extra_envs are empty",
    ),
  ),
  stage='eval',
  fields=dict(
    batch_size=Field(500, 'problems per evaluation batch', kind='count'),
    extra_envs=Field(
      (),
      "more envs the eval stage scores greedily on held-out problems at `eval.heldout_level` (0: `env.level`), e.g. `('tom_order3', 'tom_counterfactual')`; reported as `accuracy_<name>_{before,after}_rl` (`/` in a name becomes `_`) and their mean as `accuracy_extra_mean_{before,after}_rl`",
    ),
    heldout_env=Field(
      '',
      'a second env evaluated on held-out problems (generalisation), e.g. `tron/parity`; reported as `eval/heldout_accuracy`, `accuracy_heldout_{before,after}_rl`',
      stage='pretrain',
    ),
    heldout_level=Field(0, 'its level (0: `env.level`)', kind='count0', stage='pretrain'),
    lara_reference=Field(
      '',
      "LaRA: a JSONL file of never-seen items the metrics are standardised against",
      stage='pretrain',
    ),
    lara_seen=Field(
      '',
      "LaRA (train/contamination_eval.py): a JSONL file of items the run trained on; the eval stage scores how well LaRA and the output-level baselines tell them from `lara_unseen`, reported as `{lara,loglik,min_k,neg_entropy}_{auroc,tpr5}_{before,after}_rl`; empty: off",
      stage='pretrain',
    ),
    lara_unseen=Field('', 'LaRA: a JSONL file of items the run never saw', stage='pretrain'),
    lm_loss_examples=Field(
      0,
      "held-out pretraining-corpus rows (the env's corpus at `env.level` with `pretrain.corpus_noise`) whose mean NLL the eval stage reports as `lm_loss_{before,after}_rl`, a general-text loss proxy; 0: off",
      kind='count0',
    ),
    num_problems=Field(
      1000, 'held-out problems for greedy accuracy', kind='count', stage='pretrain'
    ),
    pass_k=Field(4, 'k of the unbiased pass@k', kind='count'),
    pass_n=Field(8, 'samples per problem for pass@k and sampled pass@1', kind='count'),
    pass_problems=Field(250, 'how many of the problems get `pass_n` samples', kind='count'),
    precision=Field(
      'float32',
      "weights the evaluation samples with: the trainer's (`float32`) or a deployed copy",
      stage='pretrain',
    ),
    rl_summary=Field(
      ('batch/zero_signal_groups', 'rollouts/generated'),
      'RL metric keys summarised into summary.json as `rl_mean/KEY`, `rl_sum/KEY`, `rl_last/KEY`',
    ),
    sveb=Field(
      False,
      "SVEB (train/value_benchmark.py): Monte-Carlo values of partial responses of the evaluated policies, and the MSE / Spearman / prompt-collapse of the group-mean, Numca and Hista estimators (and, after RL with advantage gae, the trained PPO critic) against them, reported as `sveb_<score>_<estimator>_{before,after}_rl`",
    ),
    sveb_continuations=Field(8, "SVEB: continuations per state (M)", kind='count'),
    sveb_cuts=Field(2, 'SVEB: states (cut points) per sampled response', kind='count'),
    sveb_group=Field(8, 'SVEB: responses per prompt (G)', kind='count'),
    sveb_prompts=Field(16, "SVEB: evaluation problems it samples (P)", kind='count'),
    welfare=Field(
      False,
      "the functional-welfare axis (env `welfare`, train/welfare_eval.py): concept vectors of the maze's rewarded and punished tiles after RL and before it, their alignment with the pre-maze valence direction, and steering; reported as `welfare_*` keys",
    ),
    welfare_alpha=Field(
      4.0, 'welfare: the steering scale (times the unit concept vector)', kind='positive'
    ),
    welfare_examples=Field(128, 'welfare: corpus episodes of each outcome', kind='count'),
    welfare_layer=Field(
      1, 'welfare: the block whose output is read and steered (1..L)', kind='count'
    ),
    seed=Field(1234, "the evaluation's random key", kind='count0', stage='pretrain'),
    temperature=Field(1.0, 'sampling temperature of pass@k / pass@1', kind='positive'),
  ),
)
