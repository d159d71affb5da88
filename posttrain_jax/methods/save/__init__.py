"""SAVE (methods_A.md; docs/save.md): the reward_model stage's RM, updated online from the
policy's own rollouts, is the policy's reward. The RM and its update are in :mod:`.online_rm`,
the math in :mod:`posttrain_jax.objectives.save_rm`. Its ``METHODS`` entry:

- ``build``: the online RM (from the ``reward_model`` stage of ``config.rl.save.path``);
- ``init_state``: ``save_rm`` (its train state) and ``save_ref`` (the first step's statistics);
- ``after_rollouts``: the current RM scores the step's rollouts; its normalised score replaces
  the verifier's reward (logged beside it as ``save/true_reward``);
- ``side_update``: one SAVE update of the RM on the same rollouts after the policy's update.
"""

from typing import NamedTuple

import jax

from posttrain_jax import streams
from posttrain_jax.methods.save import online_rm
from posttrain_jax.methods.save.fields import SAVE
from posttrain_jax.methods.save.online_rm import (
  MODES,
  VALUE_INITS,
  OnlineRM,
  build_params,
  init_ref,
  offline_batch,
  rollout_heads,
  rollout_metrics,
  score_rollouts,
)
from posttrain_jax.train import hooks
from posttrain_jax.train import state as state_lib

SEED_OFFSET = 3000  # the value head's initialisation seed: config.seed + this


class Built(NamedTuple):
  online: OnlineRM
  params: object  # the RM's initial parameters (the run state's save_rm starts from them)


def build(ctx, init_params) -> Built:
  del init_params
  return Built(*online_rm.build(ctx, ctx.config.seed + SEED_OFFSET))


def init_state(ctx, built: Built, init_params) -> dict:
  del ctx, init_params
  return {
    "save_rm": state_lib.init_state(built.params, built.online.tx),
    "save_ref": init_ref(),
  }


def after_rollouts(ctx, run, built: Built, state, gen, key, step, scratch):
  """The step's rollouts scored by the current online RM: the RM's normalised rewards replace
  the verifier's; the RM's update batch is left in ``scratch['save_batch']``."""
  del run, key, step
  online = built.online
  rewards, batch, ref, record = score_rollouts(
    online, state, gen.ro, gen.sel.valid, gen.rewards, ctx.config.rl.group_size
  )
  if online.offline is not None:
    s = ctx.config.rl.save
    offline_key = jax.random.fold_in(
      ctx.key, streams.tag("save_offline", int(state["save_rm"].step))
    )
    batch.update(
      offline_batch(online, int(s.offline_batch), offline_key, ctx.tokenizer.pad_token_id)
    )
  scratch["save_batch"] = batch
  return gen._replace(rewards=rewards), {**state, "save_ref": ref}, record


def side_update(ctx, run, built: Built, state, scratch):
  """One SAVE update of the RM on the step's rollouts (none in ``frozen`` mode)."""
  del ctx, run
  if built.online.update is None:
    return state, {}
  rm_state, metrics = built.online.update(state["save_rm"], scratch["save_batch"])
  return {**state, "save_rm": rm_state}, metrics


METHOD = hooks.Method(
  name="save",
  section="rl.save",
  active=lambda config: bool(config.rl.save.enabled),
  doc="docs/save.md",
  check=lambda config: online_rm.check(config.rl),
  build=build,
  init_state=init_state,
  stages=("reward_model",),
  after_rollouts=after_rollouts,
  side_update=side_update,
  fields={"rl.save": SAVE},
)

__all__ = [
  "METHOD",
  "MODES",
  "VALUE_INITS",
  "OnlineRM",
  "build_params",
  "init_ref",
  "online_rm",
  "rollout_heads",
  "rollout_metrics",
  "score_rollouts",
]
