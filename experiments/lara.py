r"""LaRA (methods_B.md section 11): telling evaluation items an RL run trained on from unseen ones
by how the hidden states respond to perturbations, against output-level detectors.

    python scripts/reproduce.py experiments/lara.py --seeds 5 --workers 2
    python -m posttrain_jax.main --config=experiments/lara.py:arm=contaminated,seed=0 --workdir=DIR

Items (experiments/data/lara_*.jsonl, scripts/make_datasets.py): 500 eval-split problems of
3-digit addition, 200 "seen", 200 "unseen", 100 clean references. Shared base per seed: the
quickstart's pretraining (1,000 steps, tiny). Arms, 300 steps of GRPO (16 prompts x 8) on a
fixed file of 400 prompts, about 12 passes over each:

- contaminated: the 200 seen items and 200 train-split problems;
- clean: 400 train-split problems (the same 200 first): the seen items were never trained on,
  so no detector should tell them from the unseen ones (the control).

The eval stage (config.eval.lara_seen, train/contamination_eval.py) scores every item and its
perturbations (the second operand removed, ``123+=``; the operands swapped, ``456+123=``) at the
last prompt token of every block: RSM, DC and RSI standardised against the references, their
mean is the LaRA score; the output-level detectors read the policy's log-probs of the item's
answer: mean log-likelihood, Min-K% (k = 0.2), minus the mean entropy. AUROC and TPR at 5% FPR,
seen = positive.

Why this setting exposes the mechanism: RL revisits each trained item a dozen times with the
exact verifier's reward, so a trace of the seen items can form both in the answers' likelihood
and in the representations; the clean arm gives every detector's chance level on the same item
sets. The mechanism check is that contamination left any trace at all: the best output-level
detector above chance (AUROC > 0.55) in the contaminated arm.

Claim (declared before the runs): LaRA detects the trained-on items (AUROC above 0.5), better
than the best output-level detector, and better than on the clean control.
"""

import os

from posttrain_jax import defaults

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
ARMS = {
  "contaminated": dict(dataset="lara_train.jsonl"),
  "clean": dict(dataset="lara_train_clean.jsonl"),
}


def get_config(arg=None):
  args = defaults.parse_arm_arg(arg, ARMS, "clean")
  c = defaults.addition_base(args.seed)
  c.env.dataset = os.path.join(DATA, ARMS[args.arm]["dataset"])
  c.rl.update(steps=300, eval_every=100)
  c.eval.update(
    lara_seen=os.path.join(DATA, "lara_seen.jsonl"),
    lara_unseen=os.path.join(DATA, "lara_unseen.jsonl"),
    lara_reference=os.path.join(DATA, "lara_reference.jsonl"),
  )
  if args.smoke:
    defaults.make_smoke(c)
  c.sweep = defaults.sweep(
    title="LaRA vs output-level detectors of RL-trained evaluation items (3-digit addition)",
    arms=tuple(ARMS),
    baseline="clean",
    shared_stages=("pretrain",),
    metrics=(
      "lara_auroc_after_rl",
      "lara_auroc_minus_best_baseline_after_rl",
      "loglik_auroc_after_rl",
      "min_k_auroc_after_rl",
      "neg_entropy_auroc_after_rl",
      "lara_tpr5_after_rl",
      "loglik_tpr5_after_rl",
      "accuracy_after_rl",
    ),
    curves=("reward/mean", "eval/accuracy"),
    claim=dict(
      text="LaRA detects the trained-on items above chance, better than the best output-level "
      "detector, and better than on the clean control.",
      arm="contaminated",
      metric="lara_auroc_after_rl",
      direction="higher",
      start=False,
      parts=[
        dict(
          text="above chance",
          arm="contaminated",
          value=0.5,
          metric="lara_auroc_after_rl",
          direction="higher",
        ),
        dict(
          text="above the best output-level detector",
          arm="contaminated",
          value=0.0,
          metric="lara_auroc_minus_best_baseline_after_rl",
          direction="higher",
        ),
        dict(
          text="above the clean control",
          arm="contaminated",
          versus="clean",
          metric="lara_auroc_after_rl",
          direction="higher",
        ),
      ],
    ),
    base_health=dict(metric="accuracy_before_rl", floor=0.05),
    engaged=dict(
      text="the contamination left a trace at the output (the log-likelihood detector above "
      "chance)",
      arm="contaminated",
      metric="loglik_auroc_after_rl",
      above=0.55,
    ),
  )
  return c
