r"""DenoiseRL (methods_B.md section 15): GRPO whose groups mix clean rollouts with continuations of
a weak model's wrong partial answers, against plain GRPO, the same with the prefix tokens in the
loss, and a sweep of the prefix fraction rho.

    python scripts/reproduce.py experiments/denoise.py --seeds 5
    python -m posttrain_jax.main --config=experiments/denoise.py:arm=denoise,seed=0 --workdir=DIR

Task: chain, level LEVEL (apply LEVEL one-digit operations left to right modulo 10, writing each
step: ``7+5=2;2*3=6;6-9=7;#7``; the answer is the text after the last ``#``). Shared per seed:
the policy (preset tiny) pretrained PRETRAIN steps on a corpus where a fraction NOISE of the
transcripts carry one wrong step (carried to a wrong answer), and the weak model: the same
preset pretrained WEAK steps on the same corpus (the teacher stage; an early checkpoint's
stand-in), which writes wrong steps often. Arms, RL_STEPS steps of GRPO (16 prompts x 8
samples at T = 1) on the verifier's reward; in the DenoiseRL arms 4 of each group's 8 rows
continue from the first round(rho * k) steps of a wrong weak answer (of its k steps; resampled up
to 4 times per prompt), the reward reads the continuation only:
grpo (no prefix: rho = 0), denoise (rho = 0.3, prefix masked out of the loss), denoise_unmasked
(rho = 0.3, the prefix in the loss, old log-probs recomputed), denoise_rho0.1, denoise_rho0.6.
Every arm runs on the same multi-turn sampler and has the weak model, so the recovery
evaluation is the same for all.

Why this setting exposes the mechanism: the pretrained policy's own answers carry wrong steps
(its corpus's noise), and following a wrong step to the end gives a wrong answer; the corpus
also shows, in 10% of its clean transcripts, a slip caught at once (a wrong step, ``!``, the
step redone), so the policy can recover from a wrong step it reads, rarely. Continuations from
wrong prefixes put that situation in every group, where a clean rollout meets it only when it
slips, so DenoiseRL has many more chances than GRPO to reinforce the recovery, which also
catches the policy's own slips from a clean start. The chain has LEVEL steps, so a slip
somewhere is likely and there is headroom both from clean starts and from wrong prefixes.

Pilots before the sweep (seed 0, pretraining only; their numbers were not kept): at level 4 the
policy neared its ceiling halfway through pretraining; at level 6 its greedy accuracy rose
steeply between 100 and 300 steps. So level 6, the policy pretrained 200 steps (headroom) and
the weak model 100 (it writes wrong steps often). The steep curve makes the start vary between
seeds; the paired design (every arm of a seed shares its start) absorbs that.

What the mechanism needs, and how this setting provides it: DenoiseRL needs an RL run in which
the policy's answers actually change, so that the extra practice at continuing from wrong steps
can show in what it learns, and wrong prefixes that the policy can recover from. The first sweep
(results/denoise/history.md) ran 60 steps, in which GRPO's accuracy did not move and no arm moved
from its start, so nothing could differ. Pilots on seeds 0 and 1 (their records were lost with
the machine that ran them, so they are described here, not quoted): at lr 3e-4 GRPO collapsed
within 120 steps (completions grew to the token limit and the reward fell to zero); at lr 1e-4
over 150 steps GRPO's greedy accuracy rose steadily on seed 0. So 150 steps at lr 1e-4: long
enough for GRPO to move, short of a collapse. The corpus's caught slips (``!``) give the policy
a recovery to reinforce, and the weak model's wrong answers give prefixes it can recover from.

Changed for the rerun (issue 38), before it ran: 150 RL steps instead of 60 (chosen after the
pilots above), evaluation every 25 steps; the claim's four halves are declared as parts (the
first sweep tested only the accuracy half).

Claim (declared before the runs): DenoiseRL (masked, rho = 0.3) gives higher clean-start greedy
accuracy than GRPO and a higher recovery rate from held-out wrong prefixes; the unmasked variant
does worse than the masked one; a larger rho lengthens outputs. Metric: greedy accuracy after
RL on 250 held-out problems (clean start); also recovery_after_rl (greedy continuations of 100
held-out problems after 0.3 of a wrong weak answer, scored on the continuation), accuracy on a
harder held-out level (chain level LEVEL + 2) and the mean greedy length.
"""

from posttrain_jax import defaults

LEVEL = 6
PRETRAIN = 200
WEAK = 100
NOISE = 0.3
RL_STEPS = 150
ACC = "accuracy_after_rl"

_D = dict(enabled=True, fraction=0.5, rho=0.3, tries=4, boundary=";", eval_rho=0.3)
ARMS = {
  "grpo": dict(denoise=dict(_D, rho=0.0)),
  "denoise": dict(denoise=dict(_D)),
  "denoise_unmasked": dict(denoise=dict(_D, mask_prefix=False), old_logprobs="recomputed"),
  "denoise_rho0.1": dict(denoise=dict(_D, rho=0.1)),
  "denoise_rho0.6": dict(denoise=dict(_D, rho=0.6)),
}


def get_config(arg=None):
  args = defaults.parse_arm_arg(arg, ARMS, "denoise")
  c = defaults.base_config()
  c.seed = args.seed
  c.env.update(name="chain", level=LEVEL)
  c.model.preset = "tiny"
  c.stages = ("pretrain", "teacher", "rl", "eval")
  c.pretrain.update(
    steps=PRETRAIN, batch_size=64, lr=1e-3, corpus_noise=NOISE, eval_every=250, checkpoint_every=250
  )
  # The weak model: the same preset, fewer steps on the same corpus; only DenoiseRL reads it.
  c.rl.teacher.update(source="stage", pretrain_steps=WEAK, pretrain_noise=NOISE, loss="")
  c.rl.update(
    steps=RL_STEPS, prompts_per_step=16, group_size=8, lr=1e-4, max_new_tokens=64, eval_every=25
  )
  defaults.apply_arm(c.rl, ARMS[args.arm])
  c.eval.update(
    num_problems=250,
    pass_k=4,
    pass_n=4,
    pass_problems=100,
    heldout_env="chain",
    heldout_level=LEVEL + 2,  # 8: the longest chain
    rl_summary=(
      "denoise/recovery",
      "denoise/clean_reward",
      "denoise/noisy_rows",
      "reward/mean",
      "gen/len_mean",
    ),
  )
  if args.smoke:
    defaults.make_smoke(c)
    c.rl.teacher.pretrain_steps = 4
    c.eval.heldout_level = 0
  c.sweep = defaults.sweep(
    title="DenoiseRL vs GRPO: continuations of a weak model's wrong prefixes (chain)",
    arms=tuple(ARMS),
    baseline="grpo",
    shared_stages=("pretrain", "teacher"),
    base_health=dict(metric="accuracy_before_rl", floor=0.05),
    metrics=(
      "accuracy_after_rl",
      "accuracy_before_rl",
      "recovery_after_rl",
      "recovery_before_rl",
      "accuracy_heldout_after_rl",
      "len_mean_after_rl",
      "pass_at_1_after_rl",
      "rl_mean/denoise/recovery",
      "rl_mean/denoise/clean_reward",
    ),
    curves=("eval/accuracy", "reward/mean", "denoise/recovery", "gen/len_mean"),
    claim=dict(
      text="DenoiseRL (masked prefix, rho = 0.3) gives higher clean-start greedy accuracy "
      "and a higher recovery rate from wrong prefixes than GRPO; masking the prefix beats "
      "training on it; a larger rho lengthens outputs.",
      arm="denoise",
      metric=ACC,
      direction="higher",
      parts=[
        dict(
          text="clean-start accuracy above GRPO",
          arm="denoise",
          versus="grpo",
          metric=ACC,
          direction="higher",
        ),
        dict(
          text="recovery from wrong prefixes above GRPO",
          arm="denoise",
          versus="grpo",
          metric="recovery_after_rl",
          direction="higher",
        ),
        dict(
          text="masking the prefix beats training on it",
          arm="denoise",
          versus="denoise_unmasked",
          metric=ACC,
          direction="higher",
        ),
        dict(
          text="rho = 0.6 lengthens outputs over rho = 0.3",
          arm="denoise_rho0.6",
          versus="denoise",
          metric="len_mean_after_rl",
          direction="higher",
        ),
      ],
    ),
    notes=(
      "accuracy: greedy from a clean start (held-out problems); recovery: greedy "
      "continuations after 0.3 of a wrong weak answer, scored on the continuation only "
      "(the same prefixes for every arm); accuracy_heldout: chain level LEVEL + 2; "
      "rl_mean/denoise/*: the RL steps' noisy rows' and clean rows' rewards.",
    ),
  )
  return c
