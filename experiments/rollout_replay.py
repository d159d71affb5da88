r"""Rollout-level |advantage|-prioritised replay (Yoo et al., arXiv 2606.04560; methods_A.md
section 7) vs naive group-level replay vs GRPO, from a checkpoint where rewards are sparse.

    python scripts/reproduce.py experiments/rollout_replay.py --seeds 5
    python -m posttrain_jax.main --config=experiments/rollout_replay.py:arm=rollout_replay,seed=0 \
        --workdir=DIR

Shared base per seed: the same 3-digit addition pretraining as experiments/hpo.py (450 steps,
stopped before or at the start of the accuracy jump; the pretrain/model/env sections are
identical, so hpo's bases can be copied in). Every arm samples the same fresh rollouts per step
(16 prompts x 8, 100 RL steps) and differs only in the scheduler:

- grpo: no replay, 128 rows per update.
- group_replay: naive replay of whole groups (zero-advantage ones included), FIFO buffer of 256
  groups, no age cap, uniform draws; M = 0.25 x 128 = 32 replayed rows (4 groups) per update.
- rollout_replay: individual rollouts with |A| > 0, age cap tau_max = 4 steps, P(i) ∝ |A_i|,
  drawn without replacement; the same M = 32 replayed rows per update, appended to all fresh rows.


Why this setting exposes the mechanism: with sparse rewards most groups have zero advantage, so
replaying only the rollouts with |A| > 0 reuses the rare informative samples, while whole-group
replay mostly repeats zero-signal rows. A base that solves almost nothing has no rollout with
|A| > 0 to store, so the base-health gate replaces a seed whose start has greedy accuracy below
0.05.

Claim (declared before the runs): rollout-level replay reaches a higher greedy accuracy after RL
than GRPO (and than naive group replay) at an equal number of generated rollouts, and is the
best arm on an accuracy x token-efficiency score.

Token-efficiency score (our AES analogue; the paper's AES weighs accuracy against response
length, which is fixed by the answer here): accuracy_gain_per_mtoken = (accuracy_after_rl -
accuracy_before_rl) / (RL tokens in millions), where RL tokens = completion tokens sampled
(rl_tokens/generated) + completion tokens the policy loss trained on (rl_tokens/trained, replayed
rows included), both written to summary.json by train/experiment.py. Replay arms train on 25%
more rows for the same sampling, so they pay for it in the denominator.

Changed for the rerun (issue 42), before it ran: nothing in the setting; the table was rerun
at the same config with the determinism settings (docs/reproducibility.md), so that a rerun of
its commit and seed gives its numbers, because the check of the earlier runs (made before
those settings) found the verdict not robust to the spread a rerun produced. The rerun before
it (issue 38): 5 seeds instead of 3, the base-health gate, and the claim's three comparisons
declared as parts (accuracy above GRPO and above group replay, the token-efficiency score above
GRPO); the first verdict tested only the first.
"""

from posttrain_jax import defaults

REPLAY_FRACTION = 0.25  # M = round(0.25 * rows generated per step), the same for both replay arms

ARMS = {
  "grpo": dict(name="none", kwargs={}),
  "group_replay": dict(
    name="group_replay",
    kwargs={"replay_fraction": REPLAY_FRACTION, "capacity": 256, "tau_max": None},
  ),
  "rollout_replay": dict(
    name="rollout_replay", kwargs={"replay_fraction": REPLAY_FRACTION, "tau_max": 4, "alpha": 1.0}
  ),
}


def get_config(arg=None):
  args = defaults.parse_arm_arg(arg, ARMS, "grpo")
  c = defaults.sparse_addition_base(args.seed)
  c.rl.update(steps=100, eval_every=25)
  defaults.apply_arm(c.rl.scheduler, ARMS[args.arm])
  c.eval.rl_summary = tuple(c.eval.rl_summary) + ("gen/len_mean", "replay/rows", "replay/age_mean")
  if args.smoke:
    defaults.make_smoke(c)
  c.sweep = defaults.sweep(
    title="Rollout-level prioritised replay vs naive group replay vs GRPO (3-digit addition)",
    arms=tuple(ARMS),
    baseline="grpo",
    shared_stages=("pretrain",),
    metrics=(
      "accuracy_after_rl",
      "accuracy_gain_per_mtoken",
      "rl_reward_mean",
      "accuracy_before_rl",
    ),
    curves=("reward/mean", "eval/accuracy"),
    claim=dict(
      text="Rollout-level |A|-prioritised, age-capped, fresh-anchored replay reaches a "
      "higher accuracy after RL than GRPO (and than naive group replay) at an equal number "
      "of generated rollouts, and a higher accuracy gain per token.",
      arm="rollout_replay",
      metric="accuracy_after_rl",
      direction="higher",
      parts=[
        dict(
          text=text,
          arm="rollout_replay",
          versus=versus,
          metric=metric,
          direction="higher",
        )
        for text, versus, metric in (
          ("higher accuracy than GRPO", "grpo", "accuracy_after_rl"),
          ("higher accuracy than group replay", "group_replay", "accuracy_after_rl"),
          ("higher accuracy gain per token than GRPO", "grpo", "accuracy_gain_per_mtoken"),
        )
      ],
    ),
    base_health=dict(metric="accuracy_before_rl", floor=0.05),
    notes=(
      "All arms sample 16 prompts x 8 rollouts per RL step for 100 steps; the replay arms "
      "append M = 32 replayed rows (25%) to every update; rl_reward_mean is the training "
      "reward of the fresh rollouts only.",
      "accuracy_gain_per_mtoken (accuracy x token efficiency, an AES analogue): "
      "(accuracy_after_rl - accuracy_before_rl) / ((rl_tokens/generated + "
      "rl_tokens/trained) / 1e6), tokens = completion tokens sampled + completion tokens in "
      "the policy loss (replayed rows included).",
      "accuracy_*: greedy accuracy on 1,000 held-out problems. One tiny model, 100 steps: "
      "the paper's 'gain grows with scale' is not tested.",
    ),
  )
  return c
