r"""CGTR, consolidation-gated teacher refresh (methods_A.md section 9): RL plus self-distillation
to a past copy of the student on a task with a length exploit; fixed refresh periods and EMA
teachers against the gate.

    python scripts/reproduce.py experiments/cgtr.py --seeds 5
    python -m posttrain_jax.main --config=experiments/cgtr.py:arm=cgtr,seed=0 --workdir=DIR

Task: the grammar env, level 2 (write a sentence with a given subject noun and verb; optional
adjectives, transitive and intransitive verbs), so completion lengths vary within a group (13 to
30 characters for a grammatical sentence). Shared per seed: the generator of experiments/cme.py
(preset tiny, 400 pretraining steps on a corpus with 30% ungrammatical sentences; the pretrain
section is identical, so cme's bases can be copied in). The reward is the grammaticality check
plus a length bonus 5 x length / 40 with a 40-character budget (length_bonus), so a completion
that runs to the budget (5.0, ungrammatical: no period) out-earns the longest grammatical
sentence (about 1 + 3.75). The student loss is GRPO's (16 prompts x 8 samples, lr 3e-4) plus
beta = 0.5 times the sampled reverse KL(student || teacher) (k2), the teacher a copy of the RL
start refreshed by the arm's rule: every M = 1, 5 or 20 steps, an EMA with alpha = 0.9 or 0.99,
never, or CGTR's gate (M_min = 10, delta_R = 0.01 on the grammaticality reward, delta_L = 0.25,
truncation <= 0.05; derived formulas). 150 RL steps. The sweep runs every_20, ema_0.99, never and
cgtr (the others run from this config by name).

Why this setting exposes the mechanism: lengths differ within each group, so the bonus reaches
GRPO's advantages, and running to the budget is the reward's optimum, so only the KL to a teacher
that does not follow the student holds the policy back; in a pilot on seed 0 (every_1 and never,
both stopped early) the every-step refresh collapsed by step 12 (truncation 1, grammaticality 0), while the
never-refreshed teacher held it (sampled grammaticality 0.65 to 0.79, truncation at most 0.023
from step 50 to 90, when the pilot was stopped).

This design replaces the first CGTR toy (experiments/cgtr_addition.py, results/cgtr_addition),
whose completions all had the same length, so no arm could drift; it was chosen after that
table and the pilot above, before any of these runs.

What the mechanism needs, and how this setting provides it: the gate needs a reward that improves while the length
tail stays put, so the gate has moments to open, and a length exploit that a careless refresh
would let through. With delta_L = 0.1 the length condition never held in a seed-0 pilot of the
gate (results/cgtr/pilots.jsonl): the length p95 moved from its first-step value of 29 to a
steady 32 in the first 20 steps, just over 1.1 x 29, while the reward condition held from about
step 24, so the gate never fired and CGTR was the never-refreshed teacher under another name.
delta_L = 0.25 lets the gate open on that normal settling and still shuts it on a run to the
40-character budget; the never arm is in the sweep so that a gate that does not fire is seen as
such.

Claim (declared before the runs): CGTR ends with a higher sampled grammaticality than the fixed
schedule that refreshes every 20 steps and than the EMA teacher (alpha = 0.99), and than never
refreshing the teacher. Metric: pass@1 after RL (grammatical samples at T = 1, 250 held-out
problems x 8 samples); also the final truncation rate, length p95, refresh count and greedy
accuracy.

Changed for the rerun (issue 38), before it ran: delta_L = 0.25 instead of 0.1 (chosen after the
pilot above); every_1 left out of the sweep (it collapsed to 0 on every seed of the first
sweep, results/cgtr/history.md, and cannot lose) and never added; the claim's comparators are
every_20, ema_0.99 and never, declared as parts.
"""

from posttrain_jax import defaults

PRETRAIN = 400  # = experiments/cme.py's generator

ARMS = {
  "every_1": dict(rule="every", rule_kwargs={"period": 1}),
  "every_5": dict(rule="every", rule_kwargs={"period": 5}),
  "every_20": dict(rule="every", rule_kwargs={"period": 20}),
  "ema_0.9": dict(rule="ema", rule_kwargs={"alpha": 0.9}),
  "ema_0.99": dict(rule="ema", rule_kwargs={"alpha": 0.99}),
  "never": dict(rule="never", rule_kwargs={}),
  "cgtr": dict(
    rule="cgtr",
    rule_kwargs={"min_isolation": 10, "delta_r": 0.01, "delta_l": 0.25, "max_truncation": 0.05},
  ),
}
SWEEP_ARMS = ("every_20", "ema_0.99", "never", "cgtr")
P1 = "pass_at_1_after_rl"


def get_config(arg=None):
  args = defaults.parse_arm_arg(arg, ARMS, "every_1")
  c = defaults.base_config()
  c.seed = args.seed
  c.env.update(name="grammar", level=2)
  c.model.preset = "tiny"
  c.stages = ("pretrain", "rl", "eval")
  c.pretrain.update(
    steps=PRETRAIN, batch_size=64, lr=1e-3, corpus_noise=0.3, eval_every=200, checkpoint_every=200
  )
  c.rl.update(
    steps=150,
    prompts_per_step=16,
    group_size=8,
    lr=3e-4,
    max_new_tokens=40,
    eval_every=25,
    reward_shaping={"length_bonus": {"coef": 5.0}},
  )
  c.rl.teacher.update(source="start", loss="k2", coef=0.5)
  c.rl.teacher.update(ARMS[args.arm])
  c.eval.update(
    num_problems=250,
    pass_k=4,
    pass_n=8,
    pass_problems=250,
    rl_summary=("gen/truncated", "gen/len_p95", "teacher/refreshes", "teacher/kl"),
  )
  if args.smoke:
    defaults.make_smoke(c)
  c.sweep = defaults.sweep(
    title="CGTR vs fixed-period and EMA teacher refresh under a length exploit (grammar)",
    arms=("ema_0.99", "cgtr") if args.smoke else SWEEP_ARMS,
    baseline="ema_0.99",
    shared_stages=("pretrain",),
    base_health=dict(metric="pass_at_1_before_rl", floor=0.05),
    metrics=(
      "pass_at_1_after_rl",
      "pass_at_1_before_rl",
      "accuracy_after_rl",
      "rl_last/gen/truncated",
      "rl_last/gen/len_p95",
      "rl_last/teacher/refreshes",
      "rl_mean/teacher/kl",
    ),
    curves=("eval/accuracy", "gen/len_p95", "gen/truncated", "teacher/refreshes"),
    claim=dict(
      text="The consolidation gate ends with a higher sampled grammaticality than a fixed "
      "20-step refresh, an EMA teacher and a teacher never refreshed.",
      arm="cgtr",
      metric=P1,
      direction="higher",
      parts=[
        dict(text=f"above {v}", arm="cgtr", versus=v, metric=P1, direction="higher")
        for v in ("every_20", "ema_0.99", "never")
      ],
    ),
    notes=(
      "pass@1: grammatical samples at T = 1 (the env's parser); rl_last/*: the value at "
      "the last RL step; a collapse shows as truncation near 1 and length p95 at the "
      "40-character budget.",
      "The first CGTR toy (3-digit addition, results/cgtr_addition) could not drift: "
      "every completion had the same length, so GRPO's group normalisation cancelled "
      "the bonus.",
    ),
  )
  return c
