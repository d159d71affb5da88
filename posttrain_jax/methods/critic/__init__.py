"""A learned critic for GAE (PPO; ``config.rl.advantage='gae'``): the policy's trunk with a
scalar value head (:mod:`.value_model`), trained with the clipped value loss against GAE
returns. Its ``METHODS`` entry:

- ``build``: the critic's graph, initial parameters (the RL start's trunk, a fresh head), its
  optimiser and jitted value, update and returns functions;
- ``init_state``: ``critic``, its train state (checkpointed with the policy);
- ``producers``: the ``values`` field the ``gae`` advantage reads (``train.inputs``);
- ``side_update``: ``config.rl.critic_updates`` updates on the step's fresh rows after the
  policy's update;
- ``finish``: the trained critic's parameters in ``WORKDIR/<rl stage>/critic_final``;
- ``state_values``: those parameters' values of SVEB's states after RL (``config.eval.sveb``:
  the PPO critic scored beside the group mean, Numca and Hista). Before RL there is no trained
  critic (its head is new), so it gives none.
"""

from typing import Callable, NamedTuple

import jax

from posttrain_jax import objectives
from posttrain_jax.methods.critic.value_model import (
  build_critic,
  make_critic_update,
  make_value_fn,
)
from posttrain_jax.train import hooks
from posttrain_jax.train import scheduler as scheduler_lib
from posttrain_jax.train import state as state_lib


class Built(NamedTuple):
  params: object  # the initial critic parameters (placed)
  tx: object
  values: Callable  # (params, tokens, start) -> [B, T]
  update: Callable  # (state, batch) -> (state, metrics)
  returns: Callable  # (token rewards, values, mask) -> GAE returns [B, T]


def build(ctx, init_params) -> Built:
  cfg = ctx.config.rl
  graphdef, params = build_critic(ctx.graphdef, init_params, ctx.config.seed)
  tx = state_lib.make_optimizer(lr=cfg.critic_lr, steps=cfg.steps, grad_clip=cfg.grad_clip)
  place = ctx.placement
  params = place.place(params)
  rows = scheduler_lib.gen_rows(scheduler_lib.make(cfg), cfg.prompts_per_step)
  update = make_critic_update(
    graphdef,
    tx,
    ctx.prompt_len,
    clip_eps=cfg.value_clip,
    shardings=place.step_shardings(place.state_shardings(params, tx), rows),
  )
  gae_kw = {k: v for k, v in dict(cfg.advantage_kwargs).items() if k in ("gamma", "lam")}
  returns = jax.jit(lambda r, v, m: objectives.gae_advantages(r, v, m, **gae_kw)[1])
  return Built(params, tx, make_value_fn(graphdef, ctx.prompt_len), update, returns)


def init_state(ctx, built: Built, init_params) -> dict:
  del init_params
  return {"critic": ctx.placement.init_state(built.params, built.tx)}


def values(src, rows, fields) -> jax.Array:
  """[b, T] the critic's values of the rows (before each completion token)."""
  del fields
  ro = rows.rollout
  return src.methods["critic"].values(src.state["critic"].params, ro.tokens, ro.start)


def side_update(ctx, run, built: Built, state, scratch):
  """``critic_updates`` updates of the critic on the step's fresh rows, against the GAE
  returns of their token rewards and the values they were scored with."""
  del run
  rows, fields = scratch["rows"], scratch["fields"]
  ro = rows.rollout
  batch = {
    "tokens": ro.tokens,
    "start": ro.start,
    "mask": rows.mask,
    "old_values": fields["values"],
    "returns": built.returns(fields["token_rewards"], fields["values"], rows.mask),
  }
  critic, metrics = state["critic"], {}
  for _ in range(ctx.config.rl.critic_updates):
    critic, metrics = built.update(critic, batch)
  return {**state, "critic": critic}, metrics


FINAL = "critic_final"


def finish(ctx, built: Built, state, stage: str) -> None:
  """Keeps the trained critic's parameters beside the stage's final policy."""
  del built
  ctx.save_params(stage, FINAL, state["critic"].params)


def state_values(ctx, rl_stage: str | None):
  """``name -> values(tokens, start) | None``: the trained critic's values after RL (module
  docstring); None before RL, or when the RL stage kept no critic."""

  def for_policy(name: str):
    if name != "after_rl" or rl_stage is None:
      return None
    graphdef, target = build_critic(ctx.graphdef, ctx.init_params, ctx.config.seed)
    params = ctx.load_params(rl_stage, FINAL, ctx.placement.place(target))
    if params is None:
      return None
    value_fn = make_value_fn(graphdef, ctx.prompt_len)
    return lambda tokens, start: value_fn(params, tokens, start)

  return for_policy


METHOD = hooks.Method(
  name="critic",
  section="rl.critic_lr, rl.critic_updates, rl.value_clip",
  active=lambda config: config.rl.advantage == "gae",
  doc="docs/config.md",
  build=build,
  init_state=init_state,
  producers={"values": values},
  side_update=side_update,
  finish=finish,
  state_values=state_values,
)

__all__ = ["METHOD", "Built", "build_critic", "make_critic_update", "make_value_fn"]
