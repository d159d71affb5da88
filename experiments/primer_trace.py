r"""The reasoning-data primer's ablation, its other half (methods_A.md section 15c; arXiv
2606.02113): trace length at fixed correctness. SFT on correct traces of three lengths, then
the same RL, from one start.

    python scripts/reproduce.py experiments/primer_trace.py --seeds 5 --workers 2
    python -m posttrain_jax.main --config=experiments/primer_trace.py:arm=checked,seed=0 --workdir=DIR

Task: chain, level 3 (three one-digit operations modulo 10). Shared per seed: the policy
(preset tiny) pretrained 300 steps on levels 2, 3 and 4 from a corpus where 30% of the
transcripts carry one wrong step (experiments/primer.py's start). Arms, differing only in the
SFT data's trace style (envs/chain.py ``trace``), every trace correct and ending in the same
answer: 1,024 level-3 gold transcripts, two passes of batches of 64 at lr 3e-4, then 100 GRPO
steps of 16 prompts x 8 samples at lr 1e-4 and temperature 0.7 on the answer's verifier (which
reads only the text after the last ``#``, so every style is scored alike):

- answer: the answer alone, ``#7`` (2 characters);
- steps: one written step per operation, ``8-5=3;3+3=6;6+0=6;#6`` (20 characters);
- checked: the steps, the same steps again as a check, then the answer (38 characters).

The metric is RL's gain, ``accuracy_gain``: greedy accuracy on 250 level-3 evaluation problems
after RL minus after SFT (the RL stage's start), so the styles' different SFT accuracies do not
enter it.

Why this setting exposes the mechanism: the three traces hold the same correct answers and
differ in length by 2x (checked over steps) and 10x (steps over answer), so any effect of length
on what RL gains from the same prompts and budget can show; the mechanism check reads that the
checked arm's RL does write the long traces (its first RL step's mean response length above 28
tokens, the steps trace being 20 and the checked one 38 at level 3).

Claim (declared before the runs; the survey's warning that long traces are not better
reasoning, made testable): at fixed correctness, the twice-as-long checked trace gives RL no
larger gain than the standard steps trace, tested as the steps arm's gain above the checked
arm's. Not significant means the seeds cannot tell the two apart (the table gives the smallest
difference they would detect); contradicted means the longer trace gained more. The answer-only
arm is reported beside them, outside the claim (a one-token answer to a three-step chain asks
the model to compute without writing, a different question from length at equal content).
"""

from posttrain_jax import defaults

ARMS = {"answer": "chain_answer", "steps": "chain", "checked": "chain_checked"}


def get_config(arg=None):
  args = defaults.parse_arm_arg(arg, ARMS, "steps")
  c = defaults.base_config()
  c.seed = args.seed
  c.env.update(name="chain", level=3)
  c.model.preset = "tiny"
  c.stages = ("pretrain", "sft", "rl", "eval")
  c.stage_specs = dict(sft=dict(kind="sft", overrides=dict(env=dict(name=ARMS[args.arm]))))
  c.pretrain.update(
    steps=300,
    batch_size=64,
    lr=1e-3,
    corpus_noise=0.3,
    levels=(2, 3, 4),
    eval_every=100,
    checkpoint_every=100,
  )
  c.sft.update(source="env", examples=1024, epochs=2, batch_size=64, lr=3e-4, level=3)
  c.rl.update(
    steps=100,
    prompts_per_step=16,
    group_size=8,
    lr=1e-4,
    temperature=0.7,
    max_new_tokens=40,
    eval_every=25,
  )
  c.eval.update(
    num_problems=250,
    pass_k=4,
    pass_n=4,
    pass_problems=100,
    rl_summary=("reward/mean", "gen/len_mean", "batch/zero_signal_groups"),
  )
  if args.smoke:
    defaults.make_smoke(c)
    c.sft.update(examples=16, batch_size=8, epochs=1)
  c.sweep = defaults.sweep(
    title="Primer: trace length at fixed correctness, SFT on answer-only, step and checked "
    "traces then RL (chain)",
    arms=tuple(ARMS),
    baseline="steps",
    shared_stages=("pretrain",),
    metrics=(
      "accuracy_gain",
      "accuracy_after_rl",
      "accuracy_before_rl",
      "rl_first/gen/len_mean",
      "rl_last/gen/len_mean",
      "rl_mean/batch/zero_signal_groups",
    ),
    curves=("reward/mean", "gen/len_mean", "eval/accuracy"),
    claim=dict(
      text="At fixed correctness, a twice-as-long trace gives RL no larger gain than the "
      "standard one (the steps arm's gain above the checked arm's).",
      arm="steps",
      metric="accuracy_gain",
      direction="higher",
      rivals=(),
      parts=[
        dict(
          text="steps' RL gain above checked's",
          arm="steps",
          versus="checked",
          metric="accuracy_gain",
          direction="higher",
        )
      ],
    ),
    base_health=dict(metric="accuracy_before_rl", floor=0.05),
    engaged=dict(
      text="the checked arm's RL writes the long traces (first step's mean length above 28 tokens)",
      arm="checked",
      metric="rl_first/gen/len_mean",
      above=28.0,
    ),
  )
  return c
