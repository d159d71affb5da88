"""models.with_head: a model's trunk with another head (the critic's, a reward model's, SAVE's
two columns), equal to a fresh model of that head size whose trunk and head are replaced."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posttrain_jax import models


def test_the_trunk_is_copied_bit_for_bit_and_the_head_is_the_given_one():
  config = models.preset("nano", vocab_size=23)
  graphdef, params = models.init_decoder(config, 0)
  head = jax.random.normal(jax.random.key(1), (config.hidden_size, 3), jnp.float32)
  new_graphdef, new = models.with_head(graphdef, params, head, seed=5)
  assert set(new.keys()) == set(models.TRUNK) | {"lm_head"}  # nothing beyond trunk and head
  for name in models.TRUNK:
    for a, b in zip(jax.tree.leaves(params[name]), jax.tree.leaves(new[name])):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  np.testing.assert_array_equal(np.asarray(new["lm_head"][...]), np.asarray(head))
  # The same as a fresh model with output_dim 3 whose trunk and head are replaced.
  ref_graphdef, ref = models.init_decoder(dataclasses.replace(config, output_dim=3), 9)
  for name in models.TRUNK:
    ref[name] = params[name]
  ref["lm_head"] = ref["lm_head"].replace(value=head)
  tokens = jnp.asarray([[3, 4, 5, 6], [7, 8, 9, 10]], jnp.int32)
  out = nnx.merge(new_graphdef, new)(tokens).logits
  want = nnx.merge(ref_graphdef, ref)(tokens).logits
  assert out.shape == (2, 4, 3)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
