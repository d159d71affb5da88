r"""The reasoning-data primer's ablation (methods_A.md section 15c; arXiv 2606.02113): RL on
prompts chosen by the start policy's pass rate, low, intermediate or high, against RL on the
whole pool, all from one start and at one budget.

    python scripts/reproduce.py experiments/primer.py --seeds 5 --workers 2
    python -m posttrain_jax.main --config=experiments/primer.py:arm=mid,seed=0 --workdir=DIR

Task: chain (one-digit operations modulo 10, one written step each, ``7+5=2;2*3=6;#6``), the
policy (preset tiny) pretrained 300 steps on levels 2, 3 and 4 in equal shares, from a corpus
where 30% of the transcripts carry one wrong step. The pool (config.rl.pass_band,
methods/pass_band/): 384 training prompts, 128 per level, each answered 8 times by the start at
temperature 0.7; a prompt's pass rate is the share of the 8 answers that are right. Each is
kept as a reasoning-data record with that rate as its provenance's base pass rate (the
primer's schema, envs/records.py; ``rl/pass_rates.jsonl``). Arms, 100 GRPO steps of 16
prompts x 8 samples at lr 1e-4, temperature 0.7, drawing only from the pool's prompts whose
start pass rate lies in the arm's band:

- low: [0, 2/8] (hard for the start, many never solved);
- mid: [3/8, 5/8] (intermediate);
- high: [6/8, 1] (mostly solved);
- all: [0, 1] (the whole pool, the uncurated comparator).

Evaluated on 250 level-3 evaluation problems (greedy accuracy), the same for every arm.

Why this setting exposes the mechanism: GRPO learns only from groups whose answers differ;
a prompt the start never or always solves gives a group with zero advantage, so the band sets
how much of each step's batch carries signal (``rl_mean/batch/zero_signal_groups``). The three
levels give the pool a spread of pass rates, so every band holds prompts (the mechanism check
reads the mid band's size). What the band cannot set is how what is learned on those prompts
transfers to the evaluation problems, which is what the claim is about.

Claim (declared before the runs; the survey's "gain peaks at intermediate pass rates"): RL on
the intermediate band reaches a higher greedy accuracy than RL on the low band and than RL on
the high band. RL on the whole pool is reported beside them (the survey does not say how a
band compares with no curation). The trace-length half of the ablation (i) is not run here.
"""

from posttrain_jax import defaults

BANDS = {"low": (0.0, 0.25), "mid": (0.375, 0.625), "high": (0.75, 1.0), "all": (0.0, 1.0)}
ARMS = {name: dict(pass_band=dict(low=lo, high=hi)) for name, (lo, hi) in BANDS.items()}


def get_config(arg=None):
  args = defaults.parse_arm_arg(arg, ARMS, "all")
  c = defaults.base_config()
  c.seed = args.seed
  c.env.update(name="chain", level=3)
  c.model.preset = "tiny"
  c.stages = ("pretrain", "rl", "eval")
  c.pretrain.update(
    steps=300,
    batch_size=64,
    lr=1e-3,
    corpus_noise=0.3,
    levels=(2, 3, 4),
    eval_every=100,
    checkpoint_every=100,
  )
  c.rl.update(
    steps=100,
    prompts_per_step=16,
    group_size=8,
    lr=1e-4,
    temperature=0.7,
    max_new_tokens=40,
    eval_every=25,
  )
  c.rl.pass_band.update(pool=384, levels=(2, 3, 4), samples=8)
  defaults.apply_arm(c.rl, ARMS[args.arm])
  c.eval.update(
    num_problems=250,
    pass_k=4,
    pass_n=4,
    pass_problems=100,
    rl_summary=(
      "reward/mean",
      "batch/zero_signal_groups",
      "pass_band/kept",
      "pass_band/kept_rate",
      "pass_band/pool_rate",
    ),
  )
  if args.smoke:
    defaults.make_smoke(c)
    # A random nano model solves nothing: every band but low would keep no prompt, so the
    # smoke run keeps the whole pool in every arm (it tests the plumbing, not the bands).
    c.rl.pass_band.update(pool=12, samples=2, low=0.0, high=1.0)
  c.sweep = defaults.sweep(
    title="Primer: RL on low, intermediate and high start pass rates, and on the whole pool "
    "(chain)",
    arms=tuple(ARMS),
    baseline="all",
    shared_stages=("pretrain",),
    metrics=(
      "accuracy_after_rl",
      "rl_mean/batch/zero_signal_groups",
      "rl_mean/pass_band/kept",
      "rl_mean/pass_band/kept_rate",
      "rl_mean/pass_band/pool_rate",
      "rl_mean/reward/mean",
      "accuracy_before_rl",
    ),
    curves=("reward/mean", "eval/accuracy"),
    claim=dict(
      text="RL on prompts of intermediate start pass rate reaches a higher accuracy than RL on "
      "low or high pass rates.",
      arm="mid",
      metric="accuracy_after_rl",
      direction="higher",
      parts=[
        dict(
          text="intermediate above low",
          arm="mid",
          versus="low",
          metric="accuracy_after_rl",
          direction="higher",
        ),
        dict(
          text="intermediate above high",
          arm="mid",
          versus="high",
          metric="accuracy_after_rl",
          direction="higher",
        ),
      ],
    ),
    base_health=dict(metric="accuracy_before_rl", floor=0.05),
    engaged=dict(
      text="the intermediate band holds at least one step's prompts (16)",
      arm="mid",
      metric="rl_mean/pass_band/kept",
      above=15.5,
    ),
  )
  return c
