r"""Tool use learned by RL (issue 24, item 3): multi-turn GRPO with a calculator against the same
GRPO with no tool, on multiplications too long for the tiny model to do in its head.

    python scripts/reproduce.py experiments/tool_use.py --seeds 5
    python -m posttrain_jax.main --config=experiments/tool_use.py:arm=tool,seed=0 --workdir=DIR

Task: long_mult, level LEVEL (an L-digit number times an (L-1)- or L-digit one: ``4821*907=``).
Shared per seed: the policy (preset tiny) pretrained PRETRAIN steps on a corpus where a fraction
NOISE of the transcripts answer with a guess written without the tool (the product's upper half
of digits kept, the lower half redrawn at random) and the rest call the calculator and copy its
observation: ``<tool>calculator(4821*907)</tool><obs>4372647</obs>4372647``. Arms, RL_STEPS
steps of GRPO (16 prompts x 8 samples at T = 1) on the verifier's reward (the text after the
last observation is the product): tool (config.agent.tools = calculator: each call's result is
fed back into the row's KV cache, no loss on it; every evaluation is multi-turn too) and
no_tool (single-turn rollouts: a call gets no answer, the model writes its own observation).

Why this setting exposes the mechanism: the pretrained policy calls the tool on about half of
its samples (the corpus's mix), so both the behaviour RL should reinforce (call, then copy) and
the one it should drop (guess) are sampled from the start, and only a call can be right: a
guess is right by chance only (about 10^-(L/2)). With the tool, GRPO has signal in almost every
group; without it, the model's own "observations" are guesses too, and RL has little to reward.

A seed-0 run of the tool arm was made before the sweep to check that the run works end to end
(its greedy call rate and accuracy rose over RL); no setting was changed after it.

Claim (declared before the runs): RL with the tool raises greedy accuracy and the tool-call
rate above the no-tool arm. Metric: greedy accuracy after RL on 250 held-out problems (the
verifier on the whole transcript); also the greedy call rate after RL (problems whose
transcript holds a tool observation: 0 by construction for no_tool, whose rollouts get none),
pass@1 at T = 1 and the RL steps' call rate.
"""

from posttrain_jax import defaults

LEVEL = 4
PRETRAIN = 400
NOISE = 0.5
RL_STEPS = 40

ARMS = {
  "tool": dict(tools=("calculator",), max_turns=3, max_obs_chars=16),
  "no_tool": dict(),
}


def get_config(arg=None):
  args = defaults.parse_arm_arg(arg, ARMS, "tool")
  c = defaults.base_config()
  c.seed = args.seed
  c.env.update(name="long_mult", level=LEVEL)
  c.model.preset = "tiny"
  c.stages = ("pretrain", "rl", "eval")
  c.pretrain.update(
    steps=PRETRAIN, batch_size=64, lr=1e-3, corpus_noise=NOISE, eval_every=200, checkpoint_every=200
  )
  c.rl.update(
    steps=RL_STEPS, prompts_per_step=16, group_size=8, lr=1e-4, max_new_tokens=64, eval_every=20
  )
  c.agent.update(ARMS[args.arm])
  c.eval.update(
    num_problems=250,
    pass_k=4,
    pass_n=4,
    pass_problems=100,
    rl_summary=("agent/call_rate", "agent/tool_calls", "reward/mean", "gen/len_mean"),
  )
  if args.smoke:
    defaults.make_smoke(c)
    c.env.level = 2
  c.sweep = defaults.sweep(
    title="Multi-turn GRPO with a calculator vs GRPO without a tool (long_mult)",
    arms=tuple(ARMS),
    baseline="no_tool",
    shared_stages=("pretrain",),
    base_health=dict(metric="accuracy_before_rl", floor=0.05, arm="tool"),
    metrics=(
      "accuracy_after_rl",
      "accuracy_before_rl",
      "call_rate_after_rl",
      "call_rate_before_rl",
      "pass_at_1_after_rl",
      "rl_mean/agent/call_rate",
      "rl_mean/reward/mean",
    ),
    curves=("eval/accuracy", "reward/mean", "agent/call_rate"),
    claim=dict(
      text="RL with the calculator raises greedy accuracy and the tool-call rate "
      "above GRPO without a tool.",
      arm="tool",
      metric="accuracy_after_rl",
      direction="higher",
    ),
    notes=(
      "accuracy: greedy, the verifier on the whole transcript (the text after the last "
      "observation is the product); call_rate: greedy transcripts holding a tool "
      "observation (none in no_tool's single-turn rollouts, so its call-rate columns "
      "are empty); rl_mean/agent/call_rate: the RL steps' rollouts with a call.",
    ),
  )
  return c
