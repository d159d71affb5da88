r"""Quickstart: pretrain a ~1M-parameter LM on 3-digit addition, then GRPO on the exact verifier.

    python -m posttrain_jax.main --config=experiments/quickstart.py --workdir=runs/quickstart
    python -m posttrain_jax.main --config=experiments/quickstart.py:seed=1 --workdir=runs/qs1
    python -m posttrain_jax.main --config=experiments/quickstart.py:smoke --workdir=/tmp/smoke
    python scripts/hpo.py experiments/quickstart.py --trials 12    # search RL's lr, temperature

The pretraining corpus is of mixed quality: a fraction ``pretrain.corpus_noise`` of its worked
answers forget every carry. The pretrained model therefore holds both behaviours; RL with the
exact verifier selects the correct one. (Continuing SFT on the same corpus cannot: it teaches
the mixture.) Args: ``smoke`` (seconds-long run for tests), ``seed=N``.
"""

from posttrain_jax import defaults


def get_config(arg=None):
  args = defaults.parse_arg(arg, smoke=False, seed=0)
  c = defaults.addition_base(args.seed)
  # scripts/hpo.py's search space and rungs (docs/hpo.md): RL's learning rate and sampling temperature, each
  # trial climbing 50 -> 200 RL steps from the shared pretrained model, the top third going on.
  c.hpo = dict(
    space=dict(
      rl=dict(lr=dict(low=1e-5, high=3e-3, log=True), temperature=dict(low=0.6, high=1.4))
    ),
    rungs=(dict(steps=50), dict(steps=200)),
    early_stop=dict(nonfinite={}, entropy_collapsed=dict(floor=0.01, warmup=20)),
  )
  if args.smoke:
    defaults.make_smoke(c, rl_steps=4)
    c.pretrain.update(steps=6, eval_every=3, checkpoint_every=3)
    c.rl.eval_every = 2
    c.eval.num_problems = 32
    c.hpo.rungs = (dict(steps=2), dict(steps=4))
  return c
