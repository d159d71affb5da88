"""RL+SFT parallel averaging's section, ``config.rl.sft_mix`` (methods/sft_mix/)."""

from posttrain_jax.fields import Field, Section

SFT_MIX = Section(
  "RL+SFT parallel averaging: supervised rows beside every RL batch (methods/sft_mix/)",
  unused=(
    (
      ("rl.sft_mix.beta", "rl.sft_mix.source", "rl.sft_mix.examples", "rl.sft_mix.level"),
      lambda c: not c.rl.sft_mix.enabled,
      "config.rl.sft_mix.enabled is False",
    ),
  ),
  stage='rl',
  fields=dict(
    beta=Field(
      0.5,
      "the RL loss's weight: the update's gradient is `beta grad L_RL + (1 - beta) grad L_CE`",
      kind='fraction',
    ),
    enabled=Field(
      False,
      "RL+SFT parallel averaging: each update also trains on as many gold (prompt, completion) "
      "rows as it has RL rows, drawn from a fixed pool",
    ),
    examples=Field(
      1024, "the pool's gold transcripts drawn from the env (source 'env')", kind='count'
    ),
    level=Field(0, "the env level of the pool's transcripts (0: `env.level`)", kind='count0'),
    noise=Field(
      0.0,
      "fraction of the pool's transcripts made with the task's systematic mistake",
      kind='fraction',
    ),
    source=Field(
      'env',
      "`env` (the env's gold transcripts) or a JSONL file of "
      '{"prompt": ..., "completion": ...} lines',
    ),
  ),
)
