"""The decoder's parameters built by one compiled program.

Building :class:`transformer.Decoder` eagerly runs each initializer as its own small program;
:func:`init_decoder` traces the build once under ``jit``. The parameters are the eager build's
bit for bit (tested; see ``transformer._normal``), so a seed gives the same model either way.
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from posttrain_jax.models.config import ModelConfig
from posttrain_jax.models.transformer import Decoder


def init_decoder(config: ModelConfig, seed: int) -> tuple[nnx.GraphDef, nnx.State]:
  """``(graphdef, params)`` of ``Decoder(config, rngs=nnx.Rngs(params=seed))``, built by one
  compiled program."""

  def make():
    return nnx.split(Decoder(config, rngs=nnx.Rngs(params=seed)))[1]

  graphdef, _ = nnx.split(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(params=seed))))
  return graphdef, jax.jit(make)()


TRUNK = ("embed", "layers", "final_norm")  # what a model with another head shares


def with_head(graphdef, params, head: jax.Array, seed: int = 0):
  """``(graphdef, params)`` of the model ``(graphdef, params)`` with its LM head replaced by
  ``head`` [D, K]: the same configuration with ``output_dim = K``, the trunk (:data:`TRUNK`:
  embedding, blocks, final norm) copied, no initialiser run. What a critic, a reward model and
  SAVE's two-column reward/value model are built from."""
  config = dataclasses.replace(nnx.merge(graphdef, params).config, output_dim=int(head.shape[1]))
  new_graphdef, new_params = nnx.split(
    nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(params=seed)))
  )
  for name in TRUNK:
    new_params[name] = jax.tree.map(jnp.copy, params[name])
  new_params["lm_head"] = new_params["lm_head"].replace(value=head.astype(config.jnp_param_dtype))
  return new_graphdef, new_params
