r"""ToM: answer-only RL vs Thinking-RFT trained on the counterbalanced split, where the reward
cannot be earned by the last-mention shortcut (methods_A.md section 1).

    python scripts/reproduce.py experiments/tom_counterbalanced.py --seeds 5

Declared after experiments/tom.py's table (results/tom): trained on the shortcut split, GRPO
took both RL arms to the shortcut's own accuracies, since the shortcut earns the reward 95% of
the time there. This sweep gives the same arms, settings and eval sets a training split whose
reward only belief tracking earns: tom (answers; the last box is right 1 in 4) for rl_answer and
tom_think (the reasoning transcripts, then ``#`` and the answer) for rl_think; PRETRAIN SFT
steps, then RL_STEPS GRPO steps. The held-out env is the shortcut split (tom_shortcut). The SFT
arm of tom.py is left out for time: each arm's own SFT checkpoint is its before-RL row
(``*_before_rl``: PRETRAIN SFT steps, no RL).

Why this setting exposes the mechanism: on the counterbalanced split a model scores above
chance only by tracking who saw which move, so the RL reward pays for tracking; the held-out
third-order questions (an order never trained) and counterfactual edits ask whether the
tracking generalises, which is where the paper credits the trace.

Claim (declared before the runs): RL with a reasoning trace beats answer-only RL on held-out
third-order questions (the paper: about +7% over answer-only RL). Metric:
accuracy_tom_order3_after_rl; also the gain from RL (after - before), the counterfactual edits
and the splits themselves.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tom  # noqa: E402  (the arms' settings and eval sets)

from posttrain_jax import defaults  # noqa: E402

ENVS = {"rl_answer": "tom", "rl_think": "tom_think"}


def get_config(arg=None):
  args = defaults.parse_arm_arg(arg, ENVS, "rl_answer")
  c = tom.get_config(f"arm={args.arm},seed={args.seed}" + (",smoke" if args.smoke else ""))
  c.env.name = ENVS[args.arm]
  c.eval.heldout_env = "tom_shortcut"
  c.sweep = defaults.sweep(
    title="ToM: answer-only RL vs Thinking-RFT, trained on the counterbalanced split",
    arms=tuple(ENVS),
    baseline="rl_answer",
    shared_stages=(),
    metrics=(
      "accuracy_tom_order3_after_rl",
      "accuracy_tom_order3_before_rl",
      "accuracy_tom_counterfactual_after_rl",
      "accuracy_after_rl",
      "accuracy_before_rl",
      "accuracy_heldout_after_rl",
    ),
    curves=("eval/accuracy", "eval/heldout_accuracy", "reward/mean"),
    claim=dict(
      text="RL with a reasoning trace (Thinking-RFT) beats answer-only RL on held-out "
      "third-order questions when the training reward cannot be earned by the "
      "shortcut.",
      arm="rl_think",
      metric="accuracy_tom_order3_after_rl",
      direction="higher",
    ),
    notes=(
      "accuracy_*: greedy, held-out problems; before_rl: after the arm's "
      f"{tom.PRETRAIN} SFT steps, after_rl: then {tom.RL_STEPS} GRPO steps; no suffix: "
      "the counterbalanced split tom; heldout: the shortcut split tom_shortcut; "
      "tom_order3: third-order questions; tom_counterfactual: one event edited; chance "
      "is 0.25 on the counterbalanced sets.",
    ),
  )
  return c
