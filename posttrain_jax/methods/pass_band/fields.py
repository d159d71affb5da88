"""The pass-rate band's section, ``config.rl.pass_band`` (methods/pass_band/)."""

from posttrain_jax.fields import Field, Section

PASS_BAND = Section(
  "RL on the prompts whose pass rate under the RL start lies in a band (the primer on "
  "reasoning data: difficulty relative to the model's pass rate)",
  stage="rl",
  fields=dict(
    pool=Field(
      0,
      "training prompts drawn from the env (in equal shares of `levels`) and annotated with "
      "the start's pass rate; 0: off (the RL stage draws from the env or `env.dataset`)",
      kind="count0",
    ),
    levels=Field((), "levels the pool is drawn from (empty: `env.level`)"),
    samples=Field(
      8,
      "responses per pool prompt at `rl.temperature`; its pass rate is their mean reward",
      kind="count",
    ),
    low=Field(0.0, "the band's lowest pass rate (inclusive)", kind="fraction"),
    high=Field(1.0, "the band's highest pass rate (inclusive)", kind="fraction"),
  ),
)
