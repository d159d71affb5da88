r"""SFT -> DPO -> RL against SFT -> RL at equal compute (3-digit addition), the recipe every peer
library ships (TRL, OpenRLHF, verl; Tulu 3's SFT -> DPO -> RLVR) run from one config.

    python scripts/reproduce.py experiments/sft_dpo.py --seeds 5
    python -m posttrain_jax.main --config=experiments/sft_dpo.py:arm=sft_dpo_rl,seed=0 --workdir=DIR

Shared per seed: the quickstart's pretraining (tiny model, 1,000 steps on a corpus whose answers
forget every carry half of the time, so the model writes the no-carry sum about half the time),
then a short SFT stage on the env's gold answers (SFT_EXAMPLES examples, one pass, batch 32,
lr 1e-4). The arms then spend the same compute on different data before the same RL:

- ``sft_rl``: more SFT on gold answers (SFT_MORE_STEPS steps of 64 examples);
- ``sft_dpo_rl``: DPO (beta BETA) on pairs from the env's verifier: the gold answer against the
  env's plausible wrong answer (the no-carry sum where it is wrong, else one digit changed),
  DPO_STEPS steps of 32 pairs.

Then RL_STEPS steps of GRPO (16 prompts x 8 samples) on the verifier's reward, the same in both.
Equal compute, counted in token-rows through the model with a backward pass as two forwards: a
DPO step runs the policy forward and backward over 64 rows (32 chosen, 32 rejected) and the
frozen reference forward over the same 64 rows, 64 x 3 + 64 = 256 units; an SFT step of 64
rows is 192 units, so SFT_MORE_STEPS = DPO_STEPS x 256 / 192 (both arms use the same optimiser
settings, lr 1e-4). The completions are 3-4 characters, so rows cost alike.

Why this setting exposes the mechanism: the pretrained model's main error is one systematic
mistake (the no-carry sum), and the DPO pairs put exactly that mistake in the rejected slot, so
DPO pushes its probability down directly, while SFT only raises the gold answer's. The short
shared SFT stage leaves the mistake in place (headroom), and the RL stage is short (RL_STEPS)
so that what the two pre-RL stages leave can still show after RL (the quickstart's 200 GRPO
steps bring both to the ceiling). What the mechanism needs: a rejected answer the model
actually writes (the no-carry sum is the corpus's own mistake), and headroom before and after
RL; both are checked in the table (accuracy_before_rl: after SFT or DPO, before RL).

Claim (declared before the runs): SFT -> DPO -> RL reaches a higher greedy accuracy after RL than
SFT -> RL at equal compute, and DPO on verifier pairs raises accuracy more than the same compute
of further SFT before RL. Metric: greedy accuracy on held-out problems after RL
(``accuracy_after_rl``); ``accuracy_before_rl`` is the arm's model after its SFT or DPO stage.
"""

from posttrain_jax import defaults

SFT_EXAMPLES = 512  # the shared SFT stage: one pass, batch 32 (16 steps)
DPO_STEPS = 64  # 512 pairs x 4 passes / 32 a step
DPO_PAIRS, DPO_EPOCHS, DPO_BATCH = 512, 4, 32
SFT_MORE_EXAMPLES, SFT_MORE_EPOCHS, SFT_MORE_BATCH = 1088, 5, 64  # 17 x 5 = 85 steps
SFT_MORE_STEPS = SFT_MORE_EPOCHS * SFT_MORE_EXAMPLES // SFT_MORE_BATCH  # 64 x 256 / 192 = 85.3
BETA = 0.1
LR = 1e-4
RL_STEPS = 40
ACC = "accuracy_after_rl"

ARMS = {
  "sft_rl": ("pretrain", "sft", "sft_more", "rl", "eval"),
  "sft_dpo_rl": ("pretrain", "sft", "dpo", "rl", "eval"),
}


def get_config(arg=None):
  args = defaults.parse_arm_arg(arg, ARMS, "sft_rl")
  c = defaults.addition_base(args.seed)
  c.stages = ARMS[args.arm]
  c.sft.update(source="env", examples=SFT_EXAMPLES, epochs=1, batch_size=32, lr=LR)
  c.preference.update(
    source="env",
    loss="dpo",
    beta=BETA,
    pairs=DPO_PAIRS,
    epochs=DPO_EPOCHS,
    batch_size=DPO_BATCH,
    lr=LR,
  )
  more = dict(examples=SFT_MORE_EXAMPLES, epochs=SFT_MORE_EPOCHS, batch_size=SFT_MORE_BATCH)
  c.stage_specs = dict(
    sft_more=dict(kind="sft", overrides=dict(sft=more)),
    dpo=dict(kind="preference"),
  )
  c.rl.update(steps=RL_STEPS, eval_every=10)
  if args.smoke:
    defaults.make_smoke(c)
    c.sft.update(examples=16, batch_size=8)
    c.preference.update(pairs=16, epochs=1, batch_size=8)
    c.stage_specs.sft_more.overrides.sft.update(examples=16, epochs=1, batch_size=8)
  c.sweep = defaults.sweep(
    title="SFT -> DPO -> RL vs SFT -> RL at equal compute (3-digit addition)",
    arms=tuple(ARMS),
    baseline="sft_rl",
    shared_stages=("pretrain", "sft"),
    base_health=dict(metric="accuracy_after_rl", floor=0.05),
    metrics=(ACC, "accuracy_before_rl", "pass_at_1_after_rl", "pass_at_k_after_rl"),
    curves=("eval/accuracy", "reward/mean"),
    claim=dict(
      text="SFT -> DPO -> RL reaches a higher greedy accuracy after RL than SFT -> RL at equal "
      "compute, and DPO on verifier pairs raises accuracy more than the same compute of "
      "further SFT before RL.",
      arm="sft_dpo_rl",
      metric=ACC,
      direction="higher",
      parts=[
        dict(
          text="after RL, SFT -> DPO -> RL above SFT -> RL",
          arm="sft_dpo_rl",
          versus="sft_rl",
          metric=ACC,
          direction="higher",
        ),
        dict(
          text="before RL, DPO above the same compute of further SFT",
          arm="sft_dpo_rl",
          versus="sft_rl",
          metric="accuracy_before_rl",
          direction="higher",
        ),
      ],
    ),
    notes=(
      "accuracy: greedy on held-out problems; accuracy_before_rl: the arm's model after its "
      "further-SFT or DPO stage (the RL stage's start); the base-health gate reads the shared "
      "SFT model's accuracy (the base's evaluation of pretrain -> sft).",
    ),
  )
  return c
