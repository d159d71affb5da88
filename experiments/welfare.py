r"""The functional-welfare axis (methods_B.md section 8): after RL in a maze of fresh symbols, are
the rewarded and punished tiles' concept vectors antiparallel, aligned with a valence direction
the model had before the maze, and do they steer it?

    python scripts/reproduce.py experiments/welfare.py --seeds 5 --workers 2
    python -m posttrain_jax.main --config=experiments/welfare.py:arm=maze,seed=0 --workdir=DIR

Shared base per seed: the tiny preset pretrained 1,000 steps on the welfare corpus (envs/welfare.py:
walks on a 5 x 5 grid whose episodes end in WIN or FAIL, the goal reached or not), which never
shows the maze's three tile symbols. Arms, 60 steps of Dr. GRPO (16 views x 8 samples, lr 3e-4),
the tile-to-symbol assignment = the seed's (level 1 + seed mod 6, the paper's randomised
control):

- maze: the reward is the tile the move enters (Gold 1, Path 0.5, Mold 0);
- shuffled: every view draws its own assignment, so no symbol carries a value (the control:
  the same RL, nothing to learn about the symbols).

The eval stage (config.eval.welfare, train/welfare_eval.py) reads block 1's output at the
prompt's last token: the valence direction e (WIN minus FAIL episodes) of the maze-naive start,
the concept vectors v (Gold or Mold views minus Path-only views) of the final policy and u of
the start, their cosines, and the change of the start's WIN-over-FAIL logit gap when v_gold
(unit length, x 4) is added at that block.

Why this setting exposes the mechanism: the symbols are new to the model, so whatever the maze
policy's representation of Gold and Mold holds was put there by RL; the WIN/FAIL corpus gives
the model a valence contrast before the maze, so an alignment of v with e, which u lacks, is
RL recruiting that axis. The mechanism check: the maze arm learned the maze (greedy reward above
0.8, chance 0.5).

Claim (declared before the runs): after RL the Gold and Mold vectors are antiparallel (cosine
below 0), v_gold aligns with the pre-maze valence direction more than the naive model's u_gold,
steering the naive model with v_gold raises its WIN-over-FAIL logit gap, and v_gold aligns with
e more in the maze arm than in the shuffled control.
"""

from posttrain_jax import defaults

ARMS = {"maze": dict(env="welfare"), "shuffled": dict(env="welfare_shuffled")}


def get_config(arg=None):
  args = defaults.parse_arm_arg(arg, ARMS, "shuffled")
  c = defaults.base_config()
  c.seed = args.seed
  c.env.update(name=ARMS[args.arm]["env"], level=1 + args.seed % 6)
  c.model.preset = "tiny"
  c.stages = ("pretrain", "rl", "eval")
  c.pretrain.update(steps=1000, batch_size=64, lr=1e-3, eval_every=250, checkpoint_every=250)
  c.rl.update(
    steps=60,
    prompts_per_step=16,
    group_size=8,
    lr=3e-4,
    max_new_tokens=2,
    eval_every=20,
    advantage="dr_grpo",
  )
  c.eval.update(
    num_problems=200,
    pass_k=4,
    pass_n=4,
    pass_problems=50,
    welfare=True,
    welfare_layer=1,
    rl_summary=("reward/mean", "welfare/align_gold", "welfare/cos"),
  )
  if args.smoke:
    defaults.make_smoke(c)
    c.eval.welfare_examples = 8
  c.sweep = defaults.sweep(
    title="RL recruits a valence axis: concept vectors of a fresh-symbol maze (welfare toy)",
    arms=tuple(ARMS),
    baseline="shuffled",
    shared_stages=(),
    metrics=(
      "welfare_cos_v",
      "welfare_align_v_gold",
      "welfare_align_u_gold",
      "welfare_align_gain_gold",
      "welfare_steer_gold",
      "welfare_steer_mold",
      "welfare_cos_u",
      "accuracy_after_rl",
      "rl_first/welfare/align_gold",
      "rl_last/welfare/align_gold",
      "rl_max/welfare/align_gold",
    ),
    curves=("reward/mean", "eval/accuracy"),
    claim=dict(
      text="After maze RL, Gold and Mold vectors are antiparallel, v_gold aligns with the "
      "pre-maze valence direction more than the naive model's, steers the naive model toward "
      "WIN, and aligns more than in the shuffled control.",
      arm="maze",
      metric="welfare_align_v_gold",
      direction="higher",
      start=False,
      parts=[
        dict(text="antiparallel", arm="maze", value=0.0, metric="welfare_cos_v", direction="lower"),
        dict(
          text="aligned beyond the naive model",
          arm="maze",
          value=0.0,
          metric="welfare_align_gain_gold",
          direction="higher",
        ),
        dict(
          text="steering raises WIN over FAIL",
          arm="maze",
          value=0.0,
          metric="welfare_steer_gold",
          direction="higher",
        ),
        dict(
          text="aligned beyond the shuffled control",
          arm="maze",
          versus="shuffled",
          metric="welfare_align_v_gold",
          direction="higher",
        ),
      ],
    ),
    engaged=dict(
      text="the maze was learned (greedy reward above 0.8; chance 0.5)",
      arm="maze",
      metric="accuracy_after_rl",
      above=0.8,
    ),
  )
  return c
