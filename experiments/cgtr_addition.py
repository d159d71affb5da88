r"""CGTR, consolidation-gated teacher refresh (methods_A.md section 9): RL plus self-distillation
to a past copy of the student over a long horizon on a task with a length exploit; fixed
refresh periods and EMA teachers against the gate.

    python scripts/reproduce.py experiments/cgtr_addition.py --seeds 5
    python -m posttrain_jax.main --config=experiments/cgtr_addition.py:arm=cgtr,seed=0 --workdir=DIR

Task: 3-digit addition (the quickstart's pretraining, 1,000 steps on the half-no-carry
corpus) with a length exploit: the reward is the verifier's plus 0.2 x length / 12 for every
completion (length_bonus), with a 12-token budget, so a wrong answer padded to the budget
earns up to 0.2 and growing lengths pay until they break the answers. The student loss is
GRPO's plus beta = 0.5 times the sampled reverse KL(student || teacher) (k2, whose gradient is
the reverse KL's), the teacher a copy of the RL start refreshed by the arm's rule: every
M = 1, 5 or 20 steps, an EMA with alpha = 0.9 or 0.99, or CGTR's gate (M_min = 10, delta_R =
0.01, delta_L = 0.1, truncation <= 0.05; derived formulas). 300 RL steps of 16 x 8 (5x a
60-step horizon). The sweep runs four of the six arms (every_1, every_20, ema_0.99 and cgtr; the
other two run from this config by name), cut before the runs to fit this machine's time. Why this setting exposes the mechanism: the KL to a frozen teacher holds
the length back; a teacher refreshed every step follows the student into the exploit
(reference collapse: KL -> 0, length up), the gate refuses refreshes while the length tail
grows.

Claim (declared before the runs): CGTR ends with a higher accuracy than the fixed M = 1
refresh, with fewer refreshes and no length collapse. Metric: greedy accuracy after RL; also
the final truncation rate, the final length p95 and the refresh count.
"""

from posttrain_jax import defaults

ARMS = {
  "every_1": dict(rule="every", rule_kwargs={"period": 1}),
  "every_5": dict(rule="every", rule_kwargs={"period": 5}),
  "every_20": dict(rule="every", rule_kwargs={"period": 20}),
  "ema_0.9": dict(rule="ema", rule_kwargs={"alpha": 0.9}),
  "ema_0.99": dict(rule="ema", rule_kwargs={"alpha": 0.99}),
  "cgtr": dict(
    rule="cgtr",
    rule_kwargs={"min_isolation": 10, "delta_r": 0.01, "delta_l": 0.1, "max_truncation": 0.05},
  ),
}
SWEEP_ARMS = ("every_1", "every_20", "ema_0.99", "cgtr")


def get_config(arg=None):
  args = defaults.parse_arm_arg(arg, ARMS, "every_1")
  c = defaults.addition_base(args.seed)
  c.rl.update(
    steps=300, max_new_tokens=12, eval_every=50, reward_shaping={"length_bonus": {"coef": 0.2}}
  )
  c.rl.teacher.update(source="start", loss="k2", coef=0.5)
  c.rl.teacher.update(ARMS[args.arm])
  c.eval.rl_summary = ("gen/truncated", "gen/len_p95", "teacher/refreshes", "teacher/kl")
  if args.smoke:
    defaults.make_smoke(c)
  c.sweep = defaults.sweep(
    title="CGTR vs fixed-period and EMA teacher refresh over a long horizon (3-digit "
    "addition with a length bonus)",
    arms=("every_1", "cgtr") if args.smoke else SWEEP_ARMS,
    baseline="every_1",
    shared_stages=("pretrain",),
    base_health=dict(metric="accuracy_before_rl", floor=0.05),
    metrics=(
      "accuracy_after_rl",
      "rl_last/gen/truncated",
      "rl_last/gen/len_p95",
      "rl_last/teacher/refreshes",
      "rl_mean/teacher/kl",
    ),
    curves=("eval/accuracy", "gen/len_p95", "teacher/kl", "teacher/refreshes"),
    claim=dict(
      text="The consolidation gate ends with a higher accuracy than refreshing the "
      "teacher every step.",
      arm="cgtr",
      metric="accuracy_after_rl",
      direction="higher",
    ),
    notes=(
      "rl_last/*: the value at the last RL step; a collapse shows as truncation near 1 "
      "and length p95 at the 12-token budget.",
      "Added after the runs: the mechanism needs completion lengths that vary within a "
      "group (GRPO's group normalisation cancels a bonus that every rollout of a group "
      "shares); the length and truncation columns show whether they did.",
    ),
  )
  return c
