r"""The ToM shortcut audit (methods_A.md section 1 (b), derived): SFT probes trained on ablated
inputs, on the shortcut-prone split and on the counterbalanced one.

    python scripts/reproduce.py experiments/tom_audit.py --seeds 5
    python -m posttrain_jax.main --config=experiments/tom_audit.py:arm=shortcut-final_state,seed=0 \
        --workdir=DIR

Task: envs/tom.py, level 2 (false-belief stories, questions of order 0 to 2; docs/tom.md). Each
arm trains a tiny model from scratch by SFT (PRETRAIN steps on gold answers) on one split's
problems shown through one input: the full story or the final state (the agents, the ball's
last box and the question). Also declared, and dropped after seed 1 for time (see INPUTS): the
question alone and the story without its enter/leave events (no mental-state evidence). The splits: shortcut (tom_shortcut: the answer is the last box mentioned 95%
of the time) and counterbalanced (tom: one time in four, chance among the four boxes). Each arm
is evaluated on held-out problems of its own split and input (greedy). No stage is shared: each
arm's input is its own env.

Why this setting exposes the mechanism: the ablated inputs remove exactly the evidence a belief
answer needs (who saw which move) and keep or remove the cue the shortcut split plants (the last
box); a probe that does as well without the evidence as with it has found the shortcut.

Claim (declared before the runs): on the shortcut split the final-state probe reaches almost the
full-input accuracy (S = acc(final_state) / acc(full) near 1; the paper saw up to 99% from
spurious cues), while on the counterbalanced split it stays near chance (0.25), far below the
full input. Metric: greedy accuracy after SFT (accuracy_before_rl: the runs have no RL stage);
the paired test compares each arm with counterbalanced-final_state.

Changed after the runs (issue 38), nothing rerun: the claim's halves are tested as parts. The
first verdict tested only the shortcut half (shortcut-final_state above
counterbalanced-final_state); the counterbalanced half is now two parts, the final-state probe
below the counterbalanced full story and below chance + 0.05 (the margin that makes "near
chance" testable, declared after the runs). The other arms are not rivals: the claim compares
inputs within a split, not methods (claim.rivals = ()).
"""

from posttrain_jax import defaults

LEVEL = 2
PRETRAIN = 600
SPLITS = {"shortcut": "tom_shortcut", "counterbalanced": "tom"}
# Declared with the inputs full, question, no_presence and final_state; question and
# no_presence were dropped after seed 1 to fit the session (note in the table; the sweep ran
# three times slower than planned beside a second sweep). Their partial runs were not kept;
# add them back to INPUTS and rerun to measure them.
INPUTS = ("full", "final_state")
ARMS = {
  f"{split}-{inp}": (env if inp == "full" else f"{env}/{inp}")
  for split, env in SPLITS.items()
  for inp in INPUTS
}


def get_config(arg=None):
  args = defaults.parse_arm_arg(arg, ARMS, "shortcut-full")
  c = defaults.base_config()
  c.seed = args.seed
  c.env.update(name=ARMS[args.arm], level=LEVEL)
  c.model.preset = "tiny"
  c.stages = ("pretrain", "eval")
  c.pretrain.update(
    steps=PRETRAIN, batch_size=64, lr=1e-3, corpus_noise=0.0, eval_every=200, checkpoint_every=200
  )
  c.rl.max_new_tokens = 4
  c.eval.update(num_problems=500, pass_k=1, pass_n=2, pass_problems=50)
  if args.smoke:
    defaults.make_smoke(c, pass_k=1)
  c.sweep = defaults.sweep(
    title="ToM shortcut audit: SFT probes on ablated inputs, shortcut vs counterbalanced split",
    arms=tuple(ARMS),
    baseline="counterbalanced-final_state",
    shared_stages=(),
    metrics=("accuracy_before_rl",),
    curves=("eval/accuracy", "loss/nll"),
    claim=dict(
      text="On the shortcut split a probe that sees only the final state nearly "
      "matches the full story (S near 1); on the counterbalanced split it stays "
      "near chance.",
      arm="shortcut-final_state",
      metric="accuracy_before_rl",
      direction="higher",
      parts=[
        dict(
          text="shortcut split: the final state alone scores above the counterbalanced one",
          arm="shortcut-final_state",
          versus="counterbalanced-final_state",
          metric="accuracy_before_rl",
          direction="higher",
        ),
        dict(
          text="counterbalanced split: the final state alone is far below the full story",
          arm="counterbalanced-final_state",
          versus="counterbalanced-full",
          metric="accuracy_before_rl",
          direction="lower",
        ),
        dict(
          text="counterbalanced split: the final state alone is near chance (below 0.25 + 0.05)",
          arm="counterbalanced-final_state",
          value=0.30,
          metric="accuracy_before_rl",
          direction="lower",
        ),
      ],
      rivals=(),
    ),
    notes=(
      "accuracy_before_rl: greedy accuracy after SFT on the arm's own split and input "
      "(no RL stage); S = acc(input) / acc(full) per split; chance is 0.25 (four boxes).",
      "Changed during the sweep, for time only: the question-only and no_presence "
      "inputs were declared too and dropped after seed 1 (before any table was made); "
      "their partial runs are not in this table (add them back to INPUTS to run them).",
    ),
  )
  return c
