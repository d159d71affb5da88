"""GKD's on-policy fraction ``lambda`` (Agarwal et al. 2024; TRL's ``GKDConfig.lmbda``;
``config.rl.teacher.lmbda``): during the distillation phase a step is off-policy with
probability ``1 - lambda``, its completions replaced by the problems' reference answers
(:mod:`.off_policy`). Its ``METHODS`` entry: the ``after_rollouts`` hook that flips the coin."""

from posttrain_jax.methods.gkd.off_policy import (
  answer_completions,
  off_policy,
  with_reference_answers,
)
from posttrain_jax.train import hooks


def after_rollouts(ctx, run, built, state, gen, key, step, scratch):
  """An off-policy step: the rows' completions become the reference answers, with the
  policy's log-probs of them; ``gkd/off_policy`` logs the coin."""
  del built, scratch
  off = off_policy(ctx.config.rl, step, key)
  if off:  # distil on the reference answers this step
    gen = with_reference_answers(ctx, run, gen, run.fns.full(state["policy"].params))
  return gen, state, {"gkd/off_policy": float(off)}


METHOD = hooks.Method(
  name="gkd",
  section="rl.teacher.lmbda",
  active=lambda config: bool(config.rl.teacher.loss) and float(config.rl.teacher.lmbda) < 1.0,
  doc="docs/teachers.md",
  after_rollouts=after_rollouts,
  sync_only=True,
)

__all__ = ["METHOD", "after_rollouts", "answer_completions", "off_policy", "with_reference_answers"]
