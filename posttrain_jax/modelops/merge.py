"""Merging parameter trees: pure functions on pytrees of identical structure.

Each operator takes the input trees (a stage's, in the order a ``modelop`` stage lists them)
and keyword arguments from the stage spec, and returns one tree of the same structure and
dtypes. They are the entries of :data:`posttrain_jax.modelops.MODEL_OPS`.
"""

from collections.abc import Sequence

import jax
import jax.numpy as jnp


def average(trees: Sequence, *, weights: Sequence[float] = ()) -> object:
  """The weighted average Σ_i w_i θ_i of the ``trees``, leaf by leaf, computed in float32 and
  cast back to each leaf's dtype. ``weights``: one per tree, summing to 1 (default: equal).
  Linear merging of checkpoints (model soups, RL+SFT averaging) and base-anchored fusion
  ``(1 - a) θ_base + a θ`` are this operator with two trees. A weight of exactly 0 leaves
  that tree out (its leaves are never read), so ``weights=(1, 0)`` returns the first tree's
  values bit for bit."""
  trees = list(trees)
  if not trees:
    raise ValueError("average needs at least one parameter tree")
  weights = tuple(float(w) for w in weights) or (1.0 / len(trees),) * len(trees)
  if len(weights) != len(trees):
    raise ValueError(f"average got {len(weights)} weights for {len(trees)} trees; give one each")
  if abs(sum(weights) - 1.0) > 1e-6:
    raise ValueError(f"average's weights {list(weights)} sum to {sum(weights):g}, not 1")
  kept = [(w, t) for w, t in zip(weights, trees) if w != 0.0]

  def mix(*leaves):
    out = sum(w * leaf.astype(jnp.float32) for (w, _), leaf in zip(kept, leaves))
    return out.astype(leaves[0].dtype)

  if len(kept) == 1 and kept[0][0] == 1.0:  # one tree at weight 1: itself, exactly
    return jax.tree.map(jnp.copy, kept[0][1])
  return jax.jit(lambda *ts: jax.tree.map(mix, *ts))(*(t for _, t in kept))
