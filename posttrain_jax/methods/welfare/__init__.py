"""The functional-welfare axis over RL (``config.eval.welfare``, env ``welfare``; arXiv
2605.30232, methods_B.md section 8). The eval stage measures the axis after RL against the
start (train/welfare_eval.py); this method adds it to the RL stage's periodic evaluation
(``rl.eval_every``): the current policy's concept vectors of the maze's Gold and Mold tiles,
their cosine and their alignment with the valence direction of the maze-naive RL start, logged
as ``welfare/cos`` and ``welfare/align_{gold,mold}``, so alignment is followed over the
checkpoints of the run. Its ``METHODS`` entry:

- ``build``: the tracker (the start's valence direction, computed once);
- ``rl_evaluator``: that tracker, merged with the run's evaluation.
"""

from posttrain_jax.train import hooks, welfare_eval


def active(config) -> bool:
  return bool(config.eval.welfare) and "rl" in tuple(config.stages) and config.rl.eval_every > 0


def build(ctx, init_params):
  ecfg = ctx.config.eval
  return welfare_eval.tracker(ctx, init_params, layer=ecfg.welfare_layer, n=ecfg.welfare_examples)


def rl_evaluator(ctx, built, evaluator):
  del ctx, evaluator
  return built


METHOD = hooks.Method(
  name="welfare",
  section="eval.welfare",
  active=active,
  doc="docs/inside.md",
  build=build,
  rl_evaluator=rl_evaluator,
)

__all__ = ["METHOD"]
