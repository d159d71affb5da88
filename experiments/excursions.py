r"""RL excursions during pretraining with parallel averaging of RL and SFT (arXiv 2606.04272,
methods_A.md section 8): RL, SFT, SFT -> RL and RL+SFT averaging from an intermediate
pretraining checkpoint at equal steps, scored by pass@1 against pass@32 (sharpening against
expansion) and a general-text loss.

    python scripts/reproduce.py experiments/excursions.py --seeds 5
    python -m posttrain_jax.main --config=experiments/excursions.py:arm=avg,seed=0 --workdir=DIR

Shared per seed: an intermediate pretraining checkpoint, the quickstart's pretraining (tiny
model, 3-digit addition, a corpus whose answers forget every carry half of the time) stopped at
450 of its 1,000 steps, before or at its accuracy jump (the sparse base of the hpo and
maxpo_sparse tables). Arms, STEPS updates each:

- ``rl``: GRPO (16 prompts x 8 samples, lr 1e-4) on the verifier's reward;
- ``sft``: SFT on gold answers, one per problem (STEPS steps of 32 fresh problems, lr 1e-4);
- ``sft_rl``: SFT for STEPS / 2 steps, then GRPO for STEPS / 2;
- ``avg``: parallel averaging, GRPO whose every update also trains on 128 gold rows,
  ``g = 1/2 grad L_GRPO + 1/2 grad L_CE`` (``rl.sft_mix``, beta 1/2; the pool is SFT's gold
  set).

Metrics: pass@1 and pass@32 (unbiased, from 32 samples at T = 1 on 100 held-out problems),
greedy accuracy, and the general-text proxy: the mean NLL of 512 held-out rows of the
pretraining distribution (``lm_loss``: the mixed-quality corpus the checkpoint was trained on,
eval.lm_loss_examples).

Why this setting exposes the mechanism: at 450 steps the checkpoint solves some problems
sometimes and most rarely, so pass@1 is low while pass@32 has room on both sides: RL that
reinforces what the model samples raises pass@1 (sharpening) and can lower pass@32, gold SFT
adds answers the model does not sample (expansion) but pulls the model off its pretraining
distribution, and averaging gets both gradients at every step.

What the mechanism needs, and how this setting provides it: a checkpoint whose pass@1 and
pass@32 both have headroom (an early checkpoint of a model whose pretraining corpus holds both
the right and the carry-forgetting answer), gold data that differs from the checkpoint's own
samples (one correct answer per problem), and a general-text loss that moves when the model
leaves its pretraining distribution (the corpus's own held-out rows).

Claim (declared before the runs): RL from an intermediate checkpoint raises pass@1; parallel
RL+SFT averaging reaches a higher pass@32 than RL, SFT and SFT -> RL at equal steps; SFT raises
the general-text loss more than RL. Metric: pass@32 after training (``pass_at_k_after_rl``).
"""

from posttrain_jax import defaults

STEPS = 100
GOLD = STEPS * 32  # one gold answer per problem, one pass of SFT's STEPS steps of 32
PASS_K = "pass_at_k_after_rl"

ARMS = {
  "rl": dict(stages=("pretrain", "rl", "eval"), rl_steps=STEPS, sft_steps=0, mix=False),
  "sft": dict(stages=("pretrain", "sft", "eval"), rl_steps=STEPS, sft_steps=STEPS, mix=False),
  "sft_rl": dict(
    stages=("pretrain", "sft", "rl", "eval"), rl_steps=STEPS // 2, sft_steps=STEPS // 2, mix=False
  ),
  "avg": dict(stages=("pretrain", "rl", "eval"), rl_steps=STEPS, sft_steps=0, mix=True),
}


def get_config(arg=None):
  args = defaults.parse_arm_arg(arg, ARMS, "rl")
  arm = ARMS[args.arm]
  c = defaults.sparse_addition_base(args.seed)
  c.stages = arm["stages"]
  sft_steps = arm["sft_steps"] or STEPS
  c.sft.update(source="env", examples=sft_steps * 32, epochs=1, batch_size=32, lr=1e-4)
  c.rl.update(steps=arm["rl_steps"], eval_every=25)
  c.rl.sft_mix.update(enabled=arm["mix"], beta=0.5, source="env", examples=GOLD)
  c.eval.update(pass_k=32, pass_n=32, pass_problems=100, lm_loss_examples=512)
  if args.smoke:
    defaults.make_smoke(c)
    c.sft.update(examples=16, batch_size=8)
    c.rl.sft_mix.examples = 16
    c.eval.update(pass_k=4, pass_n=4, pass_problems=8, lm_loss_examples=8)
  c.sweep = defaults.sweep(
    title="RL excursions from an intermediate checkpoint: RL, SFT, SFT -> RL, RL+SFT averaging",
    arms=tuple(ARMS),
    baseline="rl",
    shared_stages=("pretrain",),
    base_health=dict(metric="accuracy_before_rl", floor=0.05),
    metrics=(
      PASS_K,
      "pass_at_1_after_rl",
      "pass_at_1_gain",
      "accuracy_after_rl",
      "lm_loss_after_rl",
      "pass_at_k_before_rl",
    ),
    curves=("eval/accuracy", "reward/mean", "loss/sft_nll"),
    claim=dict(
      text="RL from an intermediate checkpoint raises pass@1; parallel RL+SFT averaging reaches "
      "a higher pass@32 than RL, SFT and SFT -> RL at equal steps; SFT raises the "
      "general-text loss more than RL.",
      arm="avg",
      metric=PASS_K,
      direction="higher",
      parts=[
        dict(
          text="RL raises pass@1", arm="rl", value=0.0, metric="pass_at_1_gain", direction="higher"
        ),
        dict(
          text="averaging above RL on pass@32",
          arm="avg",
          versus="rl",
          metric=PASS_K,
          direction="higher",
        ),
        dict(
          text="averaging above SFT on pass@32",
          arm="avg",
          versus="sft",
          metric=PASS_K,
          direction="higher",
        ),
        dict(
          text="averaging above SFT -> RL on pass@32",
          arm="avg",
          versus="sft_rl",
          metric=PASS_K,
          direction="higher",
        ),
        dict(
          text="SFT raises the general-text loss more than RL",
          arm="sft",
          versus="rl",
          metric="lm_loss_after_rl",
          direction="higher",
        ),
      ],
    ),
    notes=(
      "pass_at_k: pass@32 from 32 samples at T = 1 on 100 held-out problems; *_after_rl: after "
      "the arm's last training stage (SFT for sft); pass_at_1_gain: pass@1 after minus before "
      "(the shared checkpoint's); lm_loss: mean NLL of 512 held-out rows of the pretraining "
      "corpus.",
    ),
  )
  return c
