r"""A pipeline of named stages: RL on one domain, an evaluation, a weight-space merge, RL on a
second domain, and an evaluation on both (train/stages.py, docs/experiments.md).

    python -m posttrain_jax.main --config=experiments/pipeline.py --workdir=runs/pipeline
    python -m posttrain_jax.main --config=experiments/pipeline.py:smoke --workdir=/tmp/pipeline

Stages, in order:

1. ``pretrain``: the quickstart's pretraining on 3-digit addition (the two envs share one
   character set, so one tokenizer serves both).
2. ``rl_add``: GRPO on 3-digit addition (``arithmetic``, level 3) from the pretrained model.
3. ``eval_add``: RL's gain on addition (``before_rl``: pretrained, ``after_rl``: ``rl_add``).
4. ``merge``: the average of the pretrained and RL'd parameters (``modelop`` ``average``,
   weights 1/2 each): a base-anchored fusion that keeps half of RL's change.
5. ``rl_sum``: GRPO on digit sums (``digit_sum``, level 3) from the merge.
6. ``eval``: the final model on digit sums against the merge, and greedy accuracy on addition
   (``accuracy_arithmetic_*``), so the second RL stage's cost on the first domain shows.

Each stage writes ``WORKDIR/<name>/``; a rerun skips finished stages, and a changed
``stage_specs.rl_sum`` reruns ``rl_sum`` and ``eval`` only. Args: ``smoke``, ``seed=N``.
"""

from posttrain_jax import defaults

ADDITION = dict(name="arithmetic", level=3)
DIGIT_SUM = dict(name="digit_sum", level=3)


def get_config(arg=None):
  args = defaults.parse_arg(arg, smoke=False, seed=0)
  c = defaults.addition_base(args.seed)
  c.stages = ("pretrain", "rl_add", "eval_add", "merge", "rl_sum", "eval")
  c.stage_specs = dict(
    rl_add=dict(kind="rl", overrides=dict(env=ADDITION)),
    eval_add=dict(kind="eval", overrides=dict(env=ADDITION)),
    merge=dict(
      kind="modelop", op="average", inputs=("pretrain", "rl_add"), kwargs=dict(weights=(0.5, 0.5))
    ),
    rl_sum=dict(kind="rl", overrides=dict(env=DIGIT_SUM, rl=dict(steps=100))),
    eval=dict(overrides=dict(env=DIGIT_SUM, eval=dict(extra_envs=("arithmetic",)))),
  )
  if args.smoke:
    defaults.make_smoke(c, rl_steps=2)
    c.stage_specs.rl_sum.overrides.rl.steps = 2
    # every smoke reward is 0 (4 pretraining steps), so GRPO alone would not move the
    # parameters; an entropy bonus does, and the merge is then a point of its own
    c.rl.entropy_coef = 0.01
    c.eval.num_problems = 16
  return c
