"""Weight-space search's section, ``config.search`` (train/search.py; CoRP, RandOpt, ES)."""

from posttrain_jax.fields import Field, Section, free

SEARCH = Section(
  "gradient-free search from an earlier stage's policy: rewarded weight perturbations "
  "consolidated into one update per round (the search stage)",
  stage='search',
  fields=dict(
    alphas=Field(
      (0.5, 1.0, 2.0),
      'step sizes tried along the round\'s direction (theta + alpha d); the gate keeps the best or none',
    ),
    boots=Field(1000, "the gate's bootstrap resamples", kind='count'),
    cov_floor=Field(
      1.0, 'the isotropic floor lambda of the low-rank covariance (cov_rank > 0)', kind='positive'
    ),
    cov_rank=Field(
      0,
      "rounds after the first draw from U U^T + lambda I, U the previous round's top-r rewarded directions (0: isotropic)",
      kind='count0',
    ),
    eval_every=Field(1, 'rounds between evaluations (0: at the end only)', kind='count0'),
    eval_problems=Field(200, 'problems per evaluation', kind='count'),
    margin=Field(
      0.0,
      "the gate: accept when the bootstrap lower bound of the validation gain exceeds this",
      kind='finite',
    ),
    population=Field(64, 'perturbations per round (antithetic pairs: even)', kind='count'),
    prompts=Field(
      64, "training problems scoring each perturbation (greedy), new each round", kind='count'
    ),
    rounds=Field(8, 'rounds (one consolidated update each)', kind='count'),
    rule=Field('corp', 'a name of `objectives.CONSOLIDATIONS`'),
    rule_kwargs=free("the rule's hyperparameters (e.g. beta, top_k)"),
    sigma=Field(0.003, 'perturbation scale (per weight)', kind='positive'),
    val_prompts=Field(
      128, 'the fixed validation problems of the gate (training split, drawn once)', kind='count'
    ),
  ),
)
