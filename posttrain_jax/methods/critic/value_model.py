"""A learned critic for GAE (PPO): the policy's trunk with a scalar value head.

The critic starts from the RL start's embedding, blocks and final norm, with a fresh
``output_dim = 1`` head, and is trained with the clipped value loss against GAE returns.
"""

import dataclasses
from typing import Callable

import jax
from flax import nnx

from posttrain_jax import models, objectives
from posttrain_jax.train import state as state_lib
from posttrain_jax.train import updates


def build_critic(graphdef, init_params, seed: int):
  """(critic graphdef, critic params): the policy's trunk with a new [D, 1] head (the head a
  fresh model of seed ``seed`` would have)."""
  config = dataclasses.replace(nnx.merge(graphdef, init_params).config, output_dim=1)
  head = models.init_decoder(config, seed)[1]["lm_head"][...]
  return models.with_head(graphdef, init_params, head, seed)


def make_value_fn(critic_graphdef, prompt_len: int) -> Callable:
  """Jitted ``values(params, tokens [B, S+T], start [B]) -> [B, T]``: V before each token."""

  def values(params, tokens, start):
    model = nnx.merge(critic_graphdef, params)
    return model(tokens[:, :-1], start=start).logits[:, prompt_len - 1 :, 0]

  return jax.jit(values)


def make_critic_update(
  critic_graphdef, tx, prompt_len: int, *, clip_eps: float, shardings=None
) -> Callable:
  """Jitted ``update(state, batch) -> (state, metrics)`` on the clipped value loss.

  ``batch``: tokens [B, S+T], start [B], mask [B, T], old_values [B, T], returns [B, T].
  ``shardings``: see updates.jit_step.
  """
  value_fn = make_value_fn(critic_graphdef, prompt_len)
  loss_fn = objectives.VALUE_LOSSES["clipped_mse"]

  def loss(params, batch):
    values = value_fn(params, batch["tokens"], batch["start"])
    return loss_fn(values, batch["old_values"], batch["returns"], batch["mask"], clip_eps=clip_eps)

  def update(state, batch):
    (value, metrics), grads = jax.value_and_grad(loss, has_aux=True)(state.params, batch)
    state, opt_metrics = state_lib.apply_gradients(state, grads, value, tx)
    metrics = {f"critic/{k.split('/')[-1]}": v for k, v in {**metrics, **opt_metrics}.items()}
    return state, {**metrics, "critic/loss": value}

  return updates.jit_step(update, shardings, 2)
