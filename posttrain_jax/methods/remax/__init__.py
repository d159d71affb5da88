"""ReMax's baseline (Li et al. 2024): the reward of one greedy rollout per prompt, subtracted
from each sampled rollout's (the ``remax`` advantage, objectives/group_baselines.py). Its
``METHODS`` entry: a greedy sampler (``build``) and the ``baseline_rewards`` producer that the
advantage reads, run on the step's fresh rows."""

import jax

from posttrain_jax import objectives, registry, streams
from posttrain_jax.train import generation, hooks, samplers


def active(config) -> bool:
  """Whether the run's advantage reads a baseline rollout's rewards (an unknown advantage is
  left to the validator's message)."""
  advantage = objectives.ADVANTAGES.get(config.rl.advantage)
  return advantage is not None and "baseline_rewards" in registry.reads_of([advantage])


def build(ctx, init_params):
  """The greedy sampler of the baseline rollouts."""
  del init_params
  cfg = ctx.sampler_config(temperature=0.0, max_new_tokens=ctx.config.rl.max_new_tokens)
  return samplers.make_sampler(ctx, cfg, mesh=ctx.rollout_mesh)


def greedy_rewards(ctx, run, greedy, params, problems, key) -> jax.Array:
  """[P] rewards of one greedy rollout per prompt, scored like the sampled rows."""
  local, (tokens, mask) = generation.local_problems(ctx, problems, len(problems))
  ro = samplers.sample(greedy, params, tokens, mask, key, problems=local)
  return generation.score(ctx, run.host.prompts, ro, local, len(problems))[0]


def baseline_rewards(src, rows, fields) -> jax.Array:
  """[b] each row's prompt's greedy reward (fresh rows: ``src.step`` holds the step)."""
  del fields
  step = src.step
  key = jax.random.fold_in(step.key, streams.tag("greedy_baseline"))
  greedy = src.methods["remax"]
  per_prompt = greedy_rewards(step.ctx, step.run, greedy, src.params, step.sel.problems, key)
  return per_prompt[rows.rollout.group]


METHOD = hooks.Method(
  name="remax",
  section="rl.advantage='remax'",
  active=active,
  doc="docs/reference.md",
  build=build,
  producers={"baseline_rewards": baseline_rewards},
)

__all__ = ["METHOD", "baseline_rewards", "greedy_rewards"]
