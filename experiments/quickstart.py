r"""Quickstart: pretrain a ~1M-parameter LM on 3-digit addition, then GRPO on the exact verifier.

    python -m posttrain_jax.main --config=experiments/quickstart.py --workdir=runs/quickstart
    python -m posttrain_jax.main --config=experiments/quickstart.py:seed=1 --workdir=runs/qs1
    python -m posttrain_jax.main --config=experiments/quickstart.py:smoke --workdir=/tmp/smoke

The pretraining corpus is of mixed quality: a fraction ``pretrain.corpus_noise`` of its worked
answers forget every carry. The pretrained model therefore holds both behaviours; RL with the
exact verifier selects the correct one. (Continuing SFT on the same corpus cannot: it teaches
the mixture.) Args: ``smoke`` (seconds-long run for tests), ``seed=N``.
"""

from posttrain_jax import defaults


def get_config(arg=None):
  args = defaults.parse_arg(arg, smoke=False, seed=0)
  c = defaults.addition_base(args.seed)
  if args.smoke:
    defaults.make_smoke(c, rl_steps=4)
    c.pretrain.update(steps=6, eval_every=3, checkpoint_every=3)
    c.rl.eval_every = 2
    c.eval.num_problems = 32
  return c
