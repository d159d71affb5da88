r"""SAVE (methods_B.md section 6): a reward model that keeps improving on the policy's own
rollouts against a prompt value anchor, against the same RM frozen, SAVE without its filter,
and an oracle (GRPO on the hidden true reward).

    python scripts/reproduce.py experiments/save.py --seeds 5
    python -m posttrain_jax.main --config=experiments/save.py:arm=save,seed=0 --workdir=DIR

Task: char_quota, level 8 (write at least k copies of a letter in at most L letters; 140
prompts). The verifier is the hidden true reward: the policy never sees it in the RM arms (it is
only logged as save/true_reward). Shared per seed: the generator (preset tiny) pretrained
PRETRAIN steps on a corpus where half the answers are wrong (too few target letters), and a
reward_model stage: the pretrained trunk with a scalar head, trained RM_STEPS steps on PAIRS
pairs made from the env (a correct answer over a wrong one, 10% held out). Arms, RL_STEPS
steps of GRPO (16 prompts x 8 samples at T = 1, budget 16 tokens) rewarded by the normalised
RM score:
frozen (no RM update), save (one SAVE update per step: filtered within-prompt pairs,
delta = 0.5 std(A), plus the value loss), save_no_filter (every pair ordered by A), oracle
(the true reward, no RM).

Why this setting exposes the mechanism: the stage's pairs never show an answer over the length
limit (the wrong answers are all short), so the RM learns "more target letters is better" and is
blind to the limit; a policy optimising it can raise the RM's score by writing long strings of
the target letter that the true reward scores 0, so a hacking gap (RM reward rising while the
true reward falls) can open under the frozen RM, and an RM that keeps training on the policy's
current samples is measured on exactly those samples (on-policy RM accuracy). In the seed-0
pilots the length exploit did not appear (mean length 4 to 5 letters) and the frozen RM's gap
stayed small (0.3 to 0.4 step-1 spreads), but its on-policy accuracy fell along the run (0.83 to
0.66): the discrepancy SAVE's on-policy update is meant to act on.

Claim (declared before the runs): SAVE gives higher on-policy RM accuracy and higher true reward
than a frozen RM. Metric: the true reward after RL (pass@1: the verifier's rate on samples at
T = 1, 250 held-out prompts x 8 samples); also rl_mean/save/rm_accuracy (on-policy pairwise
accuracy against the true reward, within groups) and rl_last/save/hacking_gap.
"""

from posttrain_jax import defaults

PRETRAIN = 300
PAIRS = 220  # 198 to train on, 22 held out
# Few RM steps: trained 150 steps the RM is saturated on its pairs (held-out loss 6e-4, margin
# 7.6) and SAVE's contrastive loss on its own confident pairs is ~1e-3, so an update changes
# nothing (seed-0 pilot: frozen and save ended within 0.002 pass@1); 30 steps leave margins
# (held-out loss 0.02, margin 4.7, accuracy 1.0) that an on-policy update moves.
RM_STEPS = 30
RL_STEPS = 50

_SAVE = dict(enabled=True, mode="save", lr=3e-4)
# Arm -> config.rl overrides.
ARMS = {
  "frozen": dict(save=dict(_SAVE, mode="frozen")),
  "save": dict(save=dict(_SAVE)),
  "save_no_filter": dict(save=dict(_SAVE, mode="no_filter")),
  "oracle": dict(save=dict(enabled=False)),
}
SUMMARY = (
  "save/rm_accuracy",
  "save/hacking_gap",
  "save/true_reward",
  "save/rm_reward",
  "gen/len_mean",
)


def get_config(arg=None):
  args = defaults.parse_arm_arg(arg, ARMS, "save")
  c = defaults.base_config()
  c.seed = args.seed
  c.env.update(name="char_quota", level=8)
  c.model.preset = "tiny"
  c.stages = ("pretrain", "reward_model", "rl", "eval")
  c.pretrain.update(
    steps=PRETRAIN, batch_size=64, lr=1e-3, corpus_noise=0.5, eval_every=150, checkpoint_every=150
  )
  c.reward_model.update(
    pairs=PAIRS,
    eval_fraction=0.1,
    steps=RM_STEPS,
    batch_size=32,
    lr=3e-4,
    eval_every=10,
    checkpoint_every=30,
  )
  c.rl.update(
    steps=RL_STEPS, prompts_per_step=16, group_size=8, lr=1e-4, max_new_tokens=16, eval_every=25
  )
  defaults.apply_arm(c.rl, ARMS[args.arm])
  c.eval.update(num_problems=250, pass_k=4, pass_n=8, pass_problems=250, rl_summary=SUMMARY)
  if args.smoke:
    defaults.make_smoke(c, rl_steps=2)
    c.reward_model.update(pairs=32, steps=4, batch_size=8, eval_every=4, checkpoint_every=4)
  c.sweep = defaults.sweep(
    title="SAVE vs a frozen reward model vs no filter vs the oracle: an RM exploited on a "
    "letter quota with a length limit it never saw (char_quota)",
    arms=tuple(ARMS),
    baseline="frozen",
    shared_stages=("pretrain", "reward_model"),
    base_health=dict(metric="pass_at_1_before_rl", floor=0.05),
    metrics=(
      "pass_at_1_after_rl",
      "pass_at_1_before_rl",
      "accuracy_after_rl",
      "rl_mean/save/rm_accuracy",
      "rl_last/save/hacking_gap",
      "rl_last/save/true_reward",
      "rl_mean/gen/len_mean",
      "reward_model_accuracy",
    ),
    curves=(
      "save/true_reward",
      "save/rm_reward",
      "save/hacking_gap",
      "save/rm_accuracy",
      "gen/len_mean",
    ),
    claim=dict(
      text="SAVE gives higher on-policy RM accuracy and higher true reward than a frozen RM.",
      arm="save",
      metric="pass_at_1_after_rl",
      direction="higher",
    ),
    notes=(
      "pass@1: the hidden true reward's rate on samples at T=1 (the env's verifier); "
      "save/*: per RL step, on the step's rollouts (none for the oracle); hacking gap: "
      "the RM reward's rise since step 1 minus the true reward's, each in units of its "
      "step-1 spread; reward_model_accuracy: the stage's held-out pairwise accuracy.",
    ),
  )
  return c
