"""DenoiseRL's section, ``config.rl.denoise`` (methods/denoise/, docs/denoise.md)."""

from posttrain_jax.fields import Field, Section, free  # noqa: F401

DENOISE = Section(
  "DenoiseRL's prefixes (methods/denoise/, docs/denoise.md)",
  unused=(
    (
      (
        "rl.denoise.fraction",
        "rl.denoise.rho",
        "rl.denoise.tries",
        "rl.denoise.boundary",
        "rl.denoise.mask_prefix",
        "rl.denoise.eval_rho",
      ),
      lambda c: not c.rl.denoise.enabled,
      "config.rl.denoise.enabled is False",
    ),
  ),
  stage='rl',
  fields=dict(
    boundary=Field(
      ';',
      "DenoiseRL: the step delimiter prefixes are cut at (whole steps only); `''` cuts characters",
    ),
    enabled=Field(
      False,
      "DenoiseRL ([denoise.md](denoise.md)): some rows of each group continue from a weak model's wrong partial answer; the weak model is the teacher stage (`rl.teacher.source='stage'`, `pretrain_steps`, `loss=''`)",
    ),
    eval_rho=Field(
      0.3,
      "the prefix fraction of the eval stage's recovery rate (`recovery_{before,after}_rl`: greedy continuations of held-out wrong prefixes, the same for every arm)",
      kind='fraction',
    ),
    fraction=Field(
      0.5,
      "the share of each group's rows that continue from the prompt's prefix (the last `round(fraction * G)` rows); 0: none",
      kind='fraction',
    ),
    mask_prefix=Field(
      True,
      "no loss on the prefix tokens (the paper's); `False` trains on them too (needs `rl.old_logprobs='recomputed'`)",
    ),
    rho=Field(
      0.3,
      "the prefix: the first `round(rho * k)` of the wrong answer's `k` steps (at least one when `rho > 0`); 0: no prefix (GRPO on the same sampler)",
      kind='fraction',
    ),
    tries=Field(
      4,
      "weak-model samples per prompt and step; the first wrong one is the prefix's source (none wrong: no prefix)",
      kind='count',
    ),
  ),
)
