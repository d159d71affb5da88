r"""RL excursions from an earlier pretraining checkpoint: experiments/excursions.py's arms, parts
and settings from the same pretraining stopped at EARLY of its 1,000 steps instead of 450
(methods_A.md section 8 runs every arm "at several checkpoints"; excursions.py is the later one).

    python scripts/reproduce.py experiments/excursions_early.py --seeds 5

Why this checkpoint: at 450 steps pass@32 is already 0.88 before training, so the pass@32
parts had little room (results/excursions/table.md); 250 steps is earlier in the same run
(constant learning rate, the same batches: the first 250 steps of the 450-step base), where the
model solves fewer problems even with 32 samples. The paper's claim that RL "already works
early" is tested where it is hardest.

What the mechanism needs, and how this setting provides it: a checkpoint that samples a correct
answer sometimes (RL needs some reward), checked by the base-health gate on pass@32 (greedy
accuracy at 250 steps may be near 0 without the checkpoint being dead), and pass@32 below its
ceiling, so that expansion can show.

Claim (declared before the runs): as experiments/excursions.py.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import excursions  # noqa: E402  (the arms, parts and settings)

from posttrain_jax import defaults  # noqa: E402

EARLY = 250
ARMS = excursions.ARMS


def get_config(arg=None):
  args = defaults.parse_arg(arg, smoke=False, seed=0, arm="rl")
  c = excursions.get_config(f"arm={args.arm},seed={args.seed}" + (",smoke" if args.smoke else ""))
  if not args.smoke:
    c.pretrain.update(steps=EARLY, eval_every=125, checkpoint_every=125)
  c.sweep.title = (
    "RL excursions from an early checkpoint (250 steps): RL, SFT, SFT -> RL, RL+SFT averaging"
  )
  c.sweep.base_health = dict(metric="pass_at_k_before_rl", floor=0.05)
  return c
