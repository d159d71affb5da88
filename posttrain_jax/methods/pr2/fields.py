"""PR2's section, ``config.rl.pr2`` (methods/pr2/, docs/pr2.md)."""

from posttrain_jax.fields import Field, Section

PR2 = Section(
  "PR2, predictive routing replay: rollouts route with a learned prediction of the router "
  "K updates ahead, the trainer replays those routes (methods/pr2/)",
  unused=(
    (
      (
        "rl.pr2.rank",
        "rl.pr2.horizon",
        "rl.pr2.rows",
        "rl.pr2.steps",
        "rl.pr2.lr",
        "rl.pr2.loss",
        "rl.pr2.shift_gates",
      ),
      lambda c: not c.rl.pr2.enabled,
      "config.rl.pr2.enabled is False",
    ),
  ),
  stage='rl',
  fields=dict(
    enabled=Field(
      False,
      "PR2: route each rollout token to `TopK(g + f_phi(x))` (a low-rank predictor of the "
      "router `horizon` updates ahead) and replay those routes in the update (needs "
      "`rl.routing_replay`)",
    ),
    horizon=Field(
      1, "K: the predictor is fitted to the router logits this many updates later", kind='count'
    ),
    loss=Field('mse', "the predictor's loss: `mse` (logits) or `kl` (router softmax)"),
    lr=Field(0.01, "the predictor's learning rate (Adam, its own optimiser)", kind='positive'),
    rank=Field(8, "r: the predictor's rank per MoE layer (`f_phi(x) = x V U`)", kind='count'),
    rows=Field(32, "rollout rows cached per step for the predictor's targets", kind='count'),
    shift_gates=Field(
      False,
      "gates from the predicted logits instead of the rollout router's (the paper leaves it "
      "open; off keeps the behaviour log-probs equal to a replay's)",
    ),
    steps=Field(20, "the predictor's optimiser steps per RL step", kind='count'),
  ),
)
