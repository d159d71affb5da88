r"""CoRP as the paper runs it (methods_B.md section 4 (c)): one round of many perturbations
consolidated into one update, against RandOpt's best single perturbation, the plain
reward-weighted mean and GRPO at equal rollouts.

    python scripts/reproduce.py experiments/corp_one_round.py --seeds 5 --workers 2
    python -m posttrain_jax.main --config=experiments/corp_one_round.py:arm=corp,seed=0 --workdir=DIR

The same base, arms and claim as experiments/corp.py; the search is one round of N = 256
antithetic perturbations (the paper: about 500), each scored greedily on 64 training problems,
and the gate compares alpha in (0.5, 1, 2) with the start on 256 fixed validation problems:
256 x 64 + 4 x 256 = 17,408 rollouts; GRPO gets 136 steps of 16 x 8 = 17,408.

Why this setting exposes the mechanism: experiments/corp.py spread its budget over 8 rounds of
32 perturbations scored on 64 validation problems, and its gate accepted a round in 3 of 5
seeds (0.6 rounds of 8 on average; results/corp/table.md): a 32-member population's direction
is noisy, and 64 validation problems cannot certify a gain of a point or two. One population
of 256 gives the consolidation 8 times the members to average over (the paper's setting: one
round), and 256 validation problems give the gate four times the problems, so a real gain of
the consolidated direction can pass it. Declared after the corp table was seen, before these
runs.

Claim (declared before the runs): CoRP's single consolidated model is more accurate than
RandOpt's best single perturbation and than its start.
"""

import importlib.util
import os

from posttrain_jax import defaults

_spec = importlib.util.spec_from_file_location(
  "corp_rounds", os.path.join(os.path.dirname(os.path.abspath(__file__)), "corp.py")
)
corp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(corp)

SEARCH = dict(rounds=1, population=256, prompts=64, val_prompts=256, sigma=0.01, eval_every=1)
ARMS = corp.ARMS
ROLLOUTS = SEARCH["population"] * SEARCH["prompts"] + 4 * SEARCH["val_prompts"]


def get_config(arg=None):
  args = defaults.parse_arm_arg(arg, ARMS, "randopt")
  c = corp.get_config(arg)
  c.search.update(SEARCH)
  c.rl.update(steps=ROLLOUTS // (c.rl.prompts_per_step * c.rl.group_size), eval_every=34)
  if args.smoke:
    c.search.update(rounds=1, population=4, prompts=8, val_prompts=8, eval_problems=16)
    defaults.make_smoke(c)
  c.sweep.title = (
    "CoRP in one round of 256 perturbations vs RandOpt vs reward-weighted mean vs GRPO at "
    "equal rollouts (3-digit addition)"
  )
  c.sweep.engaged.after_runs = False
  c.sweep.engaged.text = "the gate accepted the consolidated update"
  c.sweep.notes = (
    f"Equal rollouts: {ROLLOUTS} greedy or sampled completions per arm (search: 1 round; "
    "GRPO: 136 steps of 128).",
  )
  return c
