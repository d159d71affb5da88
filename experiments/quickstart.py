r"""Quickstart: pretrain a ~1M-parameter LM on 3-digit addition, then GRPO on the exact verifier.

    python -m posttrain_jax.main --config=experiments/quickstart.py --workdir=runs/quickstart
    python -m posttrain_jax.main --config=experiments/quickstart.py:seed=1 --workdir=runs/qs1
    python -m posttrain_jax.main --config=experiments/quickstart.py:smoke --workdir=/tmp/smoke

The pretraining corpus is of mixed quality: a fraction ``pretrain.corpus_noise`` of its worked
answers forget every carry. The pretrained model therefore holds both behaviours; RL with the
exact verifier selects the correct one. (Continuing SFT on the same corpus cannot: it teaches
the mixture.) Args: ``smoke`` (seconds-long run for tests), ``seed=N``.
"""

from posttrain_jax.train import defaults


def get_config(arg=None):
  args = defaults.parse_arg(arg, smoke=False, seed=0)
  c = defaults.base_config()
  c.seed = args.seed
  c.env.name, c.env.level = "arithmetic", 3
  c.model.preset = "tiny"
  c.pretrain.update(steps=1000, batch_size=128, lr=1e-3, corpus_noise=0.5, eval_every=100)
  c.rl.update(steps=200, prompts_per_step=16, group_size=8, lr=1e-4, max_new_tokens=6,
              eval_every=50)
  if args.smoke:
    c.model.preset = "nano"
    c.tensorboard = False
    c.pretrain.update(steps=6, batch_size=16, eval_every=3, eval_problems=16,
                      checkpoint_every=3)
    c.rl.update(steps=4, prompts_per_step=4, group_size=4, eval_every=2, eval_problems=16,
                checkpoint_every=2)
    c.eval.update(num_problems=32, batch_size=16, pass_k=2, pass_n=4, pass_problems=8)
  return c
