r"""ToM: SFT vs answer-only RL vs RL with a reasoning trace (Thinking-RFT), trained on the
shortcut-prone split and evaluated where the shortcut fails (methods_A.md section 1).

    python scripts/reproduce.py experiments/tom.py --seeds 5
    python -m posttrain_jax.main --config=experiments/tom.py:arm=rl_think,seed=0 --workdir=DIR

Task: envs/tom.py, level 2 (false-belief stories, questions of order 0 to 2), the shortcut split
tom_shortcut (the answer is the last box mentioned 95% of the time; docs/tom.md). Arms, each
from scratch (no shared stage: the think arm pretrains on another corpus):
sft (PRETRAIN + EXTRA SFT steps on gold answers, no RL: the same updates as the RL arms spend),
rl_answer (PRETRAIN SFT steps on gold answers, then RL_STEPS GRPO steps on the verifier's
reward; the answer is written at once) and rl_think (PRETRAIN SFT steps on reasoning transcripts,
the first box and the box of each move the question's chain saw, then ``#`` and the answer;
then the same GRPO, the reward on the answer after ``#``: Thinking-RFT). Evaluated greedily on
held-out problems: the shortcut split itself, the counterbalanced split tom (the shortcut at
chance), third-order questions (tom_order3, an order never trained) and counterfactual edits
(tom_counterfactual: one event removed so that the answer changes).

Why this setting exposes the mechanism: on the training split the last-box shortcut is right
95% of the time, so a model can score well there without tracking beliefs; the counterbalanced,
third-order and counterfactual problems give the shortcut chance-level accuracy, so only belief
tracking scores there. The trace spells out the tracking step by step, which is what the paper
credits for the gain of Thinking-RFT.

Claim (declared before the runs): RL with a reasoning trace beats SFT and answer-only RL on the
held-out higher-order questions (the paper: about +10% over SFT on higher-order questions, +6%
on average, +7% over answer-only RL). Metric: greedy accuracy on tom_order3 after training
(accuracy_tom_order3_after_rl); also the counterbalanced split (accuracy_heldout_after_rl),
counterfactual edits (accuracy_tom_counterfactual_after_rl) and the training split
(accuracy_after_rl).
"""

from posttrain_jax import defaults

LEVEL = 2
PRETRAIN = 600
EXTRA = 150
RL_STEPS = 60

ARMS = {
  "sft": dict(env="tom_shortcut", pretrain=PRETRAIN + EXTRA, rl=0),
  "rl_answer": dict(env="tom_shortcut", pretrain=PRETRAIN, rl=RL_STEPS),
  "rl_think": dict(env="tom_shortcut_think", pretrain=PRETRAIN, rl=RL_STEPS),
}


def get_config(arg=None):
  args = defaults.parse_arm_arg(arg, ARMS, "sft")
  arm = ARMS[args.arm]
  c = defaults.base_config()
  c.seed = args.seed
  c.env.update(name=arm["env"], level=LEVEL)
  c.model.preset = "tiny"
  c.stages = ("pretrain", "rl", "eval")
  c.pretrain.update(
    steps=arm["pretrain"],
    batch_size=64,
    lr=1e-3,
    corpus_noise=0.0,
    eval_every=250,
    checkpoint_every=250,
  )
  c.rl.update(
    steps=arm["rl"], prompts_per_step=16, group_size=8, lr=1e-4, max_new_tokens=16, eval_every=20
  )
  c.eval.update(
    num_problems=300,
    pass_k=2,
    pass_n=4,
    pass_problems=50,
    heldout_env="tom",
    extra_envs=("tom_order3", "tom_counterfactual"),
  )
  if args.smoke:
    defaults.make_smoke(c, rl_steps=2 if arm["rl"] else 0)
  c.sweep = defaults.sweep(
    title="ToM: SFT vs answer-only RL vs Thinking-RFT, trained on the shortcut split",
    arms=tuple(ARMS),
    baseline="sft",
    shared_stages=(),
    metrics=(
      "accuracy_tom_order3_after_rl",
      "accuracy_heldout_after_rl",
      "accuracy_tom_counterfactual_after_rl",
      "accuracy_after_rl",
      "accuracy_tom_order3_before_rl",
    ),
    curves=("eval/accuracy", "eval/heldout_accuracy", "reward/mean"),
    claim=dict(
      text="RL with a reasoning trace (Thinking-RFT) beats SFT and answer-only RL on "
      "held-out higher-order (third-order) questions.",
      arm="rl_think",
      metric="accuracy_tom_order3_after_rl",
      direction="higher",
    ),
    notes=(
      "accuracy_*_after_rl: greedy, held-out problems, after the arm's training (sft: "
      "its SFT steps only; rl.steps = 0); heldout: the counterbalanced split tom; "
      "tom_order3: third-order questions; tom_counterfactual: one event edited; chance "
      "is 0.25 on all three.",
      "Added after the runs (no result changed): the last-mention shortcut scored on "
      "the same problems, beside each arm, in [shortcut.md](shortcut.md) "
      "(`python scripts/tom_shortcut.py`).",
    ),
  )
  return c
