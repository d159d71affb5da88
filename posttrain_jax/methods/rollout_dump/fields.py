"""The rollout dump's section, ``config.rl.dump_rollouts`` (methods/rollout_dump/)."""

from posttrain_jax.fields import Field, Section

DUMP = Section(
  "the RL stage's rollouts written as reasoning-data records (envs/records.py)",
  stage='rl',
  fields=dict(
    every=Field(
      0,
      "write every `every`-th step's rollouts to `<workdir>/rl/rollouts.jsonl` as records "
      "(prompt, completion and steps, the verifier's score, the step and weight version that "
      "sampled them); 0: off",
      kind='count0',
    ),
  ),
)
