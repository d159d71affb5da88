r"""Rejuvenation (arXiv 2606.09932, methods_A.md section 4): base-anchored fusion and a neuron
reset between an over-trained SFT stage and RL, against SFT 1x / 5x / 20x then GRPO.

    python scripts/reproduce.py experiments/rejuvenation.py --seeds 5
    python -m posttrain_jax.main --config=experiments/rejuvenation.py:arm=sft20_rejuv,seed=0 --workdir=DIR
    python scripts/analyze.py plasticity results/rejuvenation/runs/seed0/sft20 --stages pretrain sft

Shared per seed: the quickstart's pretraining (tiny model, 1,000 steps) on a corpus of 3- and
4-digit additions in equal shares whose answers forget every carry half of the time. Arms, each
SFT on the same SFT_EXAMPLES gold answers of 3-digit problems (batch 32, lr SFT_LR) for 1, 5
or 20 passes, then RL_STEPS steps of GRPO (16 prompts x 8 samples, 3-digit problems):

- ``sft1``, ``sft5``, ``sft20``: SFT then GRPO;
- ``sft20_rejuv``: SFT 20x, then Rejuvenation: base-anchored fusion ``theta_F = theta_0 +
  ALPHA (theta_S - theta_0)`` with the pretrained model as theta_0 (the embeddings kept at
  theta_S), then the RESET share of each layer's MLP neurons that drifted most from theta_0
  reset to theta_0's weights (modelops ``fuse`` and ``reset_neurons``, two modelop stages),
  then GRPO.

Evaluation: greedy accuracy on 3-digit problems before RL (after SFT or Rejuvenation) and after
RL, the gain (after - before), pass@4 from 8 samples, the policy entropy during RL, and an
out-of-distribution split: 4-digit problems (longer operands), which pretraining saw and SFT and
RL never do.

Why this setting exposes the mechanism: SFT on a small fixed set of gold answers for many
passes memorises them: the model becomes sharply peaked on its answers, its samples agree, and
GRPO's groups lose the variance its advantages need, so RL moves an over-trained model little;
narrow SFT also moves weights that served the 4-digit problems. Fusion with the pretrained
model takes back part of the SFT update and the reset returns the most-moved neurons, restoring
variance and some of what SFT overwrote.

What the mechanism needs, and how this setting provides it: an SFT stage long enough that the
model is measurably over-confident (20 passes over 64 examples at lr 1e-3, 40 steps: the
pretraining learning rate on a set the model can memorise; `scripts/analyze.py plasticity` on
an arm's run shows mean max-prob and entropy on the gold rows after each stage), while 1 pass
(2 steps) barely moves it; headroom after SFT (the SFT set is 64 problems, far from the 3-digit
distribution, so greedy accuracy on held-out problems stays below the ceiling); and an OOD split
the pretrained model can partly solve (4-digit problems were half of its corpus).

Claim (declared before the runs): over-trained SFT checkpoints gain little from RL; Rejuvenation
(fusion + neuron reset) recovers the RL gain and improves the out-of-distribution split.
Metric: the RL stage's greedy-accuracy gain on held-out 3-digit problems (``accuracy_gain``);
also greedy accuracy after RL, the 4-digit split after RL, pass@4 and the RL entropy.
"""

from posttrain_jax import defaults

SFT_EXAMPLES = 64
SFT_LR = 1e-3
ALPHA = 0.7
RESET = 0.05
RL_STEPS = 100
GAIN = "accuracy_gain"

_REJUV = dict(
  fuse=dict(
    kind="modelop",
    op="fuse",
    inputs=("pretrain", "sft"),
    kwargs=dict(alpha=ALPHA, modules={"embed": 1.0}),
  ),
  reset=dict(
    kind="modelop",
    op="reset_neurons",
    inputs=("fuse", "pretrain"),
    kwargs=dict(fraction=RESET, score="drift", mode="base"),
  ),
)
ARMS = {
  "sft1": dict(epochs=1, stages=("pretrain", "sft", "rl", "eval"), specs={}),
  "sft5": dict(epochs=5, stages=("pretrain", "sft", "rl", "eval"), specs={}),
  "sft20": dict(epochs=20, stages=("pretrain", "sft", "rl", "eval"), specs={}),
  "sft20_rejuv": dict(
    epochs=20, stages=("pretrain", "sft", "fuse", "reset", "rl", "eval"), specs=_REJUV
  ),
}


def get_config(arg=None):
  args = defaults.parse_arm_arg(arg, ARMS, "sft20")
  arm = ARMS[args.arm]
  c = defaults.addition_base(args.seed)
  c.pretrain.levels = (3, 4)
  c.stages = arm["stages"]
  c.stage_specs = dict(arm["specs"])
  c.sft.update(
    source="env", examples=SFT_EXAMPLES, level=3, epochs=arm["epochs"], batch_size=32, lr=SFT_LR
  )
  c.rl.update(steps=RL_STEPS, eval_every=25)
  c.eval.update(pass_k=4, pass_n=8, heldout_env="arithmetic", heldout_level=4)
  c.eval.rl_summary = ("policy/entropy", "reward/mean")
  if args.smoke:
    defaults.make_smoke(c)
    c.sft.update(examples=8, batch_size=4, epochs=min(arm["epochs"], 2))
    c.eval.heldout_level = 0
  c.sweep = defaults.sweep(
    title="Rejuvenation: fusion and neuron reset between over-trained SFT and GRPO (addition)",
    arms=tuple(ARMS),
    baseline="sft20",
    shared_stages=("pretrain",),
    base_health=dict(metric="accuracy_before_rl", floor=0.05),
    metrics=(
      GAIN,
      "accuracy_after_rl",
      "accuracy_before_rl",
      "accuracy_heldout_after_rl",
      "pass_at_k_after_rl",
      "rl_mean/policy/entropy",
    ),
    curves=("eval/accuracy", "reward/mean", "policy/entropy"),
    claim=dict(
      text="Over-trained SFT checkpoints gain little from RL; Rejuvenation (fusion + neuron "
      "reset) recovers the RL gain and improves the out-of-distribution split.",
      arm="sft20_rejuv",
      metric=GAIN,
      direction="higher",
      parts=[
        dict(
          text="SFT 1x gains more from RL than SFT 20x",
          arm="sft1",
          versus="sft20",
          metric=GAIN,
          direction="higher",
        ),
        dict(
          text="Rejuvenation recovers the RL gain of SFT 20x",
          arm="sft20_rejuv",
          versus="sft20",
          metric=GAIN,
          direction="higher",
        ),
        dict(
          text="Rejuvenation improves the 4-digit split after RL",
          arm="sft20_rejuv",
          versus="sft20",
          metric="accuracy_heldout_after_rl",
          direction="higher",
        ),
      ],
    ),
    notes=(
      "accuracy_gain: greedy accuracy after RL minus before RL (after SFT, or after "
      "Rejuvenation) on held-out 3-digit problems; accuracy_heldout: 4-digit problems; "
      "rl_mean/policy/entropy: the RL steps' mean policy entropy.",
    ),
  )
  return c
