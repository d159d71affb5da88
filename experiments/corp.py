r"""CoRP (methods_B.md section 4): rewarded weight perturbations consolidated into one update a
round, against RandOpt's best single perturbation, the plain reward-weighted mean and GRPO at
equal rollouts.

    python scripts/reproduce.py experiments/corp.py --seeds 5 --workers 2
    python -m posttrain_jax.main --config=experiments/corp.py:arm=corp,seed=0 --workdir=DIR

Shared base per seed: the early-stopped 3-digit addition pretraining of experiments/hpo.py
(450 steps; greedy accuracy near 0.2, the paper's "partly trained" start). The search arms run
the `search` stage (train/search.py) for 8 rounds of 32 antithetic perturbations, each scored
greedily on 64 new training problems, then a gate on 64 fixed validation problems over alpha in
(0.5, 1, 2): 8 x (32 x 64 + 4 x 64) = 18,432 rollouts. GRPO gets the same rollouts: 144 steps of
16 prompts x 8 samples.

- corp: softmax(R~) weights then CoRP's compatibility reweighting (derived formulas).
- reward_mean: the softmax-weighted mean without the reweighting (the ES-style mean).
- randopt: the best single perturbation of the round (RandOpt's one-model answer).
- grpo: gradient RL at the same rollouts.

Why this setting exposes the mechanism: sigma = 0.01 is the scale at which single perturbations
move a policy's accuracy by a few points (pilot on seed 0's base: population reward std 0.040
at sigma 0.01, 0.018 at 0.003, 0.013 at 0.001, on 64 problems), the paper's "+-5%"; the start
solves some problems, so rewards differ between perturbations and there is something to
consolidate, and the gate keeps a round's update only when it helps on held-out problems.

Claim (declared before the runs): CoRP's single consolidated model is more accurate than the
best single perturbation (RandOpt) and than its start. Metric: greedy accuracy after the
stage (accuracy_after_rl: the eval stage compares the final policy with its start).

Changed for the rerun (issue 42), before it ran: nothing in the setting; the table was rerun
at the same config with the determinism settings (docs/reproducibility.md), so that a rerun of
its commit and seed gives its numbers, because the check of the earlier runs (made before
those settings) found the verdict not robust to the spread a rerun produced.
"""

from posttrain_jax import defaults

SEARCH = dict(rounds=8, population=32, prompts=64, val_prompts=64, sigma=0.01, eval_every=2)
ARMS = {
  "corp": dict(rule="corp"),
  "reward_mean": dict(rule="reward_mean"),
  "randopt": dict(rule="randopt"),
  "grpo": None,
}
# The search's own record, summarised per run (rl_sum/..., rl_mean/...): how many rounds the gate
# accepted, the population's reward spread, the split-half direction overlap.
MECHANISM = ("search/accepted", "search/reward_std", "search/split_half_overlap")
ROLLOUTS = SEARCH["rounds"] * (SEARCH["population"] * SEARCH["prompts"] + 4 * SEARCH["val_prompts"])


def get_config(arg=None):
  args = defaults.parse_arm_arg(arg, ARMS, "randopt")
  c = defaults.sparse_addition_base(args.seed)
  c.search.update(SEARCH)
  c.rl.update(steps=ROLLOUTS // (c.rl.prompts_per_step * c.rl.group_size), eval_every=36)
  c.eval.rl_summary = tuple(c.eval.rl_summary) + MECHANISM
  if ARMS[args.arm] is None:
    c.stages = ("pretrain", "rl", "eval")
  else:
    c.stages = ("pretrain", "search", "eval")
    c.search.rule = ARMS[args.arm]["rule"]
  if args.smoke:
    defaults.make_smoke(c)
    c.search.update(rounds=2, population=4, prompts=8, val_prompts=8, eval_problems=16)
  c.sweep = defaults.sweep(
    title="CoRP vs RandOpt vs reward-weighted mean vs GRPO at equal rollouts (3-digit addition)",
    arms=tuple(ARMS),
    baseline="randopt",
    metrics=(
      "accuracy_after_rl",
      "accuracy_before_rl",
      "accuracy_gain",
      "rl_sum/search/accepted",
      "rl_mean/search/reward_std",
    ),
    curves=("search/val_base", "eval/accuracy"),
    claim=dict(
      text="CoRP's one consolidated model is more accurate than RandOpt's best single "
      "perturbation and than its start.",
      arm="corp",
      metric="accuracy_after_rl",
      direction="higher",
      parts=[
        dict(
          text="above RandOpt",
          arm="corp",
          versus="randopt",
          metric="accuracy_after_rl",
          direction="higher",
        ),
        dict(
          text="above its start", arm="corp", value=0.0, metric="accuracy_gain", direction="higher"
        ),
      ],
    ),
    base_health=dict(metric="accuracy_before_rl", floor=0.05),
    engaged=dict(
      text="the gate accepted at least one consolidated round",
      arm="corp",
      metric="rl_sum/search/accepted",
      above=0,
      after_runs=True,
    ),
    notes=(
      f"Equal rollouts: {ROLLOUTS} greedy or sampled completions per arm (search: 8 rounds; "
      "GRPO: 144 steps of 128).",
      "Changed after the first run, before its rerun: the search's own record "
      "(rl_sum/search/accepted: rounds of 8 the gate accepted; rl_mean/search/reward_std) was "
      "added as columns, recomputed by rerunning only the eval stage of the finished runs, "
      "and the mechanism check (a round accepted) declared; arms, seeds, claim and every "
      "other setting are as declared.",
    ),
  )
  return c
