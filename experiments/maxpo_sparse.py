r"""MaxPO vs PKPO-style pass@K vs GRPO from a sparse-reward start, where pass@4 is far from 1.

    python scripts/reproduce.py experiments/maxpo_sparse.py --seeds 5
    python scripts/grad_variance.py experiments/maxpo_sparse.py --seeds 5 --batches 64

The first MaxPO sweep (experiments/maxpo.py) started from the quickstart's checkpoint, where
pass@4 sits near its ceiling before and after RL for every arm (results/maxpo/history.md): no room to show
a pass@K gain. This variant starts where experiments/hpo.py starts (pretraining stopped at 450
steps). Arms, K = 4, G = 8 and the learning rate are those of experiments/maxpo.py (Adam makes
the step size independent of the advantages' scale; the runs log train/update_norm to check
it).

Why this setting exposes the mechanism: from the early-stopped base most problems are solved by
some but not all of 8 samples, so pass@4 has headroom and the pass@K estimators' baselines
differ on the groups with one or two correct rollouts; a base that solves almost nothing gives
all-zero groups to every estimator alike, so the base-health gate replaces a seed whose start
has greedy accuracy below 0.05.

Claim (declared before the runs): MaxPO gives better pass@K than PKPO and GRPO. The paper's
lower-variance half is measured apart, on the same rollouts at the start checkpoint, by
scripts/grad_variance.py (grad_variance.md); the verdict covers the pass@K parts.

Changed for the rerun (issue 42), before it ran: nothing in the setting; the table was rerun
at the same config with the determinism settings (docs/reproducibility.md), so that a rerun of
its commit and seed gives its numbers, because the check of the earlier runs (made before
those settings) found the verdict not robust to the spread a rerun produced. The rerun before it (issue 38): 5 seeds instead of 3, the
base-health gate, and the two pass@K comparisons declared as parts.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import maxpo  # noqa: E402  (the arms and settings of the first sweep)

from posttrain_jax import defaults  # noqa: E402

ARMS = maxpo.ARMS
PASS_K = "pass_at_k_after_rl"


def get_config(arg=None):
  args = defaults.parse_arg(arg, smoke=False, seed=0, arm="grpo")
  c = maxpo.get_config(f"arm={args.arm},seed={args.seed}")
  c.pretrain.update(steps=450, eval_every=150, checkpoint_every=150)
  if args.smoke:  # the claim's two arms (maxpo.py's smoke runs all three)
    defaults.make_smoke(c, group_size=8, pass_k=4)
    c.sweep.arms = ("grpo", "maxpo")
  c.sweep.title = "MaxPO vs PKPO vs GRPO from a sparse-reward start, trained for pass@4"
  c.sweep.curves = ("reward/mean", "eval/accuracy", "train/grad_norm", "train/update_norm")
  c.sweep.notes = (
    "pass@4 is the unbiased estimator from 8 samples per problem on 250 held-out problems; "
    "accuracy is greedy on 1,000.",
    "Start: pretraining stopped at 450 steps (as experiments/hpo.py), so pass@4 has headroom.",
    "Gradient variance: grad_variance.md, measured on this table's five bases "
    "(scripts/grad_variance.py).",
  )
  c.sweep.claim.parts = [
    dict(text=f"pass@4 above {v}", arm="maxpo", versus=v, metric=PASS_K, direction="higher")
    for v in ("grpo", "pkpo")
  ]
  c.sweep.base_health = dict(metric="accuracy_before_rl", floor=0.05)
  return c
