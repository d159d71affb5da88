r"""CME, the cross-model entropy reward (methods_B.md section 14): RL a generator on the mean
log-likelihood of its own sentences under a separate frozen verifier LM, against self-certainty
(the generator's own mean log-prob) and the ground-truth oracle.

    python scripts/reproduce.py experiments/cme.py --seeds 5
    python -m posttrain_jax.main --config=experiments/cme.py:arm=cme,seed=0 --workdir=DIR

Task: the grammar env, level 2 (write a sentence with a given subject noun and verb; adjectives,
transitive and intransitive verbs; 56 prompts). Shared per seed: the generator (preset tiny)
pretrained PRETRAIN steps on a corpus where 30% of the sentences are ungrammatical variants
(a dropped, doubled or swapped word, a missing determiner or period, a wrong valency), and a
teacher stage: the verifier LM, the same preset pretrained as long on the clean corpus. Arms,
RL_STEPS steps of GRPO (16 prompts x 8 samples at T = 1) that differ only in the reward:
the verifier's mean log-likelihood of the completion (cme; config.rl.reward_shaping.cme, the
env's verifier at weight 0: label-free), the generator's own mean log-prob (self_certainty;
label-free) and the env's grammaticality check (oracle). Why this setting exposes the
mechanism: the generator samples ungrammatical sentences about as often as its corpus had them
(headroom in the sampled grammaticality rate), the verifier was trained on clean text so its
likelihood ranks those errors low, while the generator's own likelihood does not single them
out (they are its own habits).

Claim (declared before the runs): CME raises the sampled grammaticality over the base model and
over self-certainty. Metric: pass@1 after RL (the grammaticality rate of samples at T = 1, 250
held-out prompts x 8 samples); also greedy accuracy and the distinct correct sentences.
"""

from posttrain_jax import defaults

PRETRAIN = 400
RL_STEPS = 60

# Arm -> (config.rl overrides, config.reward.terms).
ARMS = {
  "cme": (dict(reward_shaping={"cme": {"coef": 1.0}}), {"correct": {"weight": 0.0}}),
  "self_certainty": (
    dict(reward_shaping={"self_certainty": {"coef": 1.0}}),
    {"correct": {"weight": 0.0}},
  ),
  "oracle": (dict(), {}),
}


def get_config(arg=None):
  args = defaults.parse_arm_arg(arg, ARMS, "cme")
  c = defaults.base_config()
  c.seed = args.seed
  c.env.update(name="grammar", level=2)
  c.model.preset = "tiny"
  c.stages = ("pretrain", "teacher", "rl", "eval")
  c.pretrain.update(
    steps=PRETRAIN, batch_size=64, lr=1e-3, corpus_noise=0.3, eval_every=200, checkpoint_every=200
  )
  # The verifier: the same preset on the clean corpus; scores only (no distillation loss).
  c.rl.teacher.update(
    source="stage", pretrain_steps=PRETRAIN, pretrain_noise=0.0, loss="", temperature=1.0
  )
  c.rl.update(
    steps=RL_STEPS, prompts_per_step=16, group_size=8, lr=1e-4, max_new_tokens=48, eval_every=20
  )
  rl_overrides, terms = ARMS[args.arm]
  defaults.apply_arm(c.rl, rl_overrides)
  c.reward.terms = terms
  c.eval.update(
    num_problems=250,
    pass_k=4,
    pass_n=8,
    pass_problems=250,
    rl_summary=("shaping/cme", "shaping/self_certainty", "gen/len_mean"),
  )
  if args.smoke:
    defaults.make_smoke(c)
    c.rl.teacher.pretrain_steps = 4
  c.sweep = defaults.sweep(
    title="CME vs self-certainty vs the oracle: label-free rewards for a noisy generator (grammar)",
    arms=tuple(ARMS),
    baseline="self_certainty",
    shared_stages=("pretrain", "teacher"),
    base_health=dict(metric="pass_at_1_before_rl", floor=0.05),
    metrics=(
      "pass_at_1_after_rl",
      "pass_at_1_before_rl",
      "accuracy_after_rl",
      "teacher_accuracy",
      "distinct_correct_after_rl",
      "rl_mean/gen/len_mean",
    ),
    curves=("eval/pass@1", "shaping/cme", "shaping/self_certainty", "reward/mean"),
    claim=dict(
      text="The verifier's mean log-likelihood (CME) raises the sampled "
      "grammaticality more than the generator's own (self-certainty).",
      arm="cme",
      metric="pass_at_1_after_rl",
      direction="higher",
    ),
    notes=(
      "pass@1: grammatical samples at T=1 (the env's parser: ground truth); "
      "teacher_accuracy: the verifier LM's own greedy accuracy; *_before_rl: the "
      "generator after pretraining.",
    ),
  )
  return c
