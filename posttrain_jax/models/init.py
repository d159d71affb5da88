"""The decoder's parameters built by one compiled program.

Building :class:`transformer.Decoder` eagerly runs each initializer as its own small program;
:func:`init_decoder` traces the build once under ``jit``. The parameters are the eager build's
bit for bit (tested; see ``transformer._normal``), so a seed gives the same model either way.
"""

import jax
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
