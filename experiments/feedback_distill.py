r"""Feedback Distillation (methods_B.md section 7): an EMA teacher that reads programmatic
feedback on the student's own attempt, against GRPO and FD then GRPO at equal steps.

    python scripts/reproduce.py experiments/feedback_distill.py --seeds 5
    python -m posttrain_jax.main --config=experiments/feedback_distill.py:arm=fd,seed=0 \
        --workdir=DIR

Task: paths in a random directed graph (env graph_path, level 3: 8 nodes, 2 out-edges; a
problem has ~2.4 correct paths). Shared per seed: the student (preset tiny) pretrained 250
steps on a corpus where 20% of the paths are wrong and half of the prompts carry feedback on an
attempt (the first invalid step and a valid alternative edge, or OK) before the prompt, with
the correct path as the answer, so the model learns to read feedback. Arms, 40 RL steps of
16 prompts x 8 rollouts each: GRPO on the verifier (grpo); FD, the forward KL over the
vocabulary from an EMA teacher (mu = 0.99) whose prompt carries the feedback on the student's
own completion, on the student's samples, no policy-gradient term (fd); FD for 20 steps then
GRPO for 20 (fd_grpo). (Declared with 60 steps and pass@8 on 250 problems; cut to 40 and 100
before any RL run, to fit the session's CPU time: graph-path steps cost ~2 s here.) Why this setting exposes the mechanism: a wrong path has a first
invalid step that the feedback names, so the teacher's distribution differs from the
student's exactly where the student errs (a dense, token-level signal), while GRPO's reward is
one bit per path.

Claim (declared before the runs): FD then GRPO gives the best pass@1 (greedy accuracy) and FD
keeps a higher policy entropy than GRPO. Metric: greedy accuracy after RL on 1,000 held-out
problems; also pass@8 and the mean policy entropy over RL.

Changed after the runs (issue 38), nothing rerun: the paper's pass@1 is the sampled one, so the
claim's metric is now pass_at_1_after_rl (samples at T = 1) instead of greedy accuracy, which
stays in the table; the entropy half of the claim, declared above and left out of the first
verdict, is now tested as its second part.
"""

from posttrain_jax import defaults

FD = dict(source="start", rule="ema", rule_kwargs={"alpha": 0.99}, loss="forward", pg_during=False)
ARMS = {
  "grpo": dict(loss=""),
  "fd": dict(FD),
  "fd_grpo": dict(FD, steps=20),
}


def get_config(arg=None):
  args = defaults.parse_arm_arg(arg, ARMS, "grpo")
  c = defaults.base_config()
  c.seed = args.seed
  c.env.update(name="graph_path", level=3)
  c.model.preset = "tiny"
  c.pretrain.update(
    steps=250, batch_size=128, lr=1e-3, corpus_noise=0.2, eval_every=125, checkpoint_every=125
  )
  c.rl.update(
    steps=40, prompts_per_step=16, group_size=8, lr=1e-4, max_new_tokens=10, eval_every=20
  )
  c.rl.teacher.update(context="feedback", pretrain_context=0.5)
  c.rl.teacher.update(ARMS[args.arm])
  c.eval.update(
    pass_k=8,
    pass_n=16,
    pass_problems=100,
    rl_summary=("policy/entropy", "loss/distill", "teacher/kl"),
  )
  if args.smoke:
    defaults.make_smoke(c)
    c.rl.teacher.steps = min(c.rl.teacher.steps, 1)
  c.sweep = defaults.sweep(
    title="Feedback Distillation vs GRPO vs FD then GRPO (graph paths)",
    arms=tuple(ARMS),
    baseline="grpo",
    shared_stages=("pretrain",),
    base_health=dict(metric="accuracy_before_rl", floor=0.05),
    metrics=(
      "pass_at_1_after_rl",
      "accuracy_after_rl",
      "pass_at_k_after_rl",
      "rl_mean/policy/entropy",
      "accuracy_before_rl",
    ),
    curves=("eval/accuracy", "policy/entropy", "loss/distill", "reward/mean"),
    claim=dict(
      text="Feedback distillation then GRPO reaches a higher pass@1 than GRPO "
      "alone at equal steps, and FD keeps a higher policy entropy than GRPO.",
      arm="fd_grpo",
      metric="pass_at_1_after_rl",
      direction="higher",
      parts=[
        dict(
          text="FD then GRPO: higher sampled pass@1 than GRPO",
          arm="fd_grpo",
          versus="grpo",
          metric="pass_at_1_after_rl",
          direction="higher",
        ),
        dict(
          text="FD: higher policy entropy than GRPO",
          arm="fd",
          versus="grpo",
          metric="rl_mean/policy/entropy",
          direction="higher",
        ),
      ],
    ),
    notes=(
      "pass_at_1_after_rl: samples at T=1 (16 per problem on 100 held-out problems); "
      "accuracy_after_rl: greedy on 1,000.",
      "pass_at_k_after_rl: unbiased pass@8 from 16 samples at T=1 on 100 held-out "
      "problems; rl_mean/policy/entropy: the mean token entropy of the update's "
      "batches over RL.",
    ),
  )
  return c
