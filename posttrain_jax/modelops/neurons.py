"""MLP neurons of the decoder: scores per (layer, hidden unit) and their reset.

A neuron ``j`` of layer ``l`` is column ``j`` of ``layers/gate`` and ``layers/up`` ([L, d, F])
and row ``j`` of ``layers/down`` ([L, F, d]) of the dense decoder (models/transformer.py): the
SwiGLU output is ``down^T (silu(gate^T x) * (up^T x))``, so a neuron whose ``down`` row is zero
adds nothing to the residual stream whatever its input weights are. Rejuvenation's neuron reset
(methods_A.md section 4) is :func:`reset_neurons`.
"""

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from posttrain_jax.modelops.anchored import leaf_name

GATE, UP, DOWN = "layers/gate", "layers/up", "layers/down"


def _mlp(tree) -> dict:
  """``{name: leaf}`` for the three MLP leaves, with a clear error for other models."""
  found = {
    leaf_name(p): x
    for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
    if leaf_name(p) in (GATE, UP, DOWN)
  }
  if len(found) != 3 or found[DOWN].ndim != 3 or found[GATE].shape != found[UP].shape:
    raise ValueError(
      "neuron operators need the dense decoder's stacked MLP (layers/gate, layers/up [L, d, F] "
      "and layers/down [L, F, d]); this tree has "
      f"{sorted(found) or 'none of them'} (a mixture-of-experts model has no such neurons)"
    )
  return found


def drift_scores(tuned, base) -> jax.Array:
  """[L, F] squared distance of each neuron's weights (its gate and up columns, its down row)
  from the base's: the neurons that moved most."""
  t, b = _mlp(tuned), _mlp(base)
  sq = lambda n: jnp.square(t[n].astype(jnp.float32) - b[n].astype(jnp.float32))  # noqa: E731
  return sq(GATE).sum(1) + sq(UP).sum(1) + sq(DOWN).sum(2)


def magnitude_scores(tree) -> jax.Array:
  """[L, F] minus the squared norm of each neuron's weights: the smallest (nearly dormant by
  weight) neurons score highest. A weight-only proxy; activation dormancy needs data:
  ``scores=-analysis.plasticity.dormancy_scores(graphdef, params, tokens)``."""
  m = _mlp(tree)
  sq = lambda n: jnp.square(m[n].astype(jnp.float32))  # noqa: E731
  return -(sq(GATE).sum(1) + sq(UP).sum(1) + sq(DOWN).sum(2))


def select(scores: jax.Array, fraction: float) -> jax.Array:
  """[L, F] bool: in each layer the ``round(fraction · F)`` highest-scoring neurons."""
  if not 0.0 <= float(fraction) <= 1.0:
    raise ValueError(f"neuron fraction={fraction} must lie in [0, 1]")
  n = int(round(float(fraction) * scores.shape[1]))
  if n == 0:
    return jnp.zeros(scores.shape, bool)
  _, idx = jax.lax.top_k(scores, n)
  return jnp.zeros(scores.shape, bool).at[jnp.arange(scores.shape[0])[:, None], idx].set(True)


def reset_neurons(
  trees: Sequence,
  *,
  fraction: float,
  score: str = "drift",
  mode: str = "base",
  scores=None,
  seed: int = 0,
) -> object:
  """Resets the ``fraction`` of each layer's MLP neurons with the highest score, with
  ``trees = (θ, θ_base)``; every other weight keeps θ's value bit for bit.

  ``score``: ``drift`` (moved most from the base), ``magnitude`` (smallest weights) or
  ``random`` (the control); ``scores``: an [L, F] array instead (e.g. ReDo's activation
  dormancy, ``-analysis.plasticity.dormancy_scores(...)``: the least active neurons first). ``mode``: ``base`` puts the neuron's gate/up columns and down row back to the base's
  values; ``reinit`` draws fresh gate/up columns (normal, each layer's column scale) and zeroes
  the down row (ReDo-style): the fresh input weights change nothing, the model computes what it
  computes with those neurons pruned, which is its own function exactly when they contributed
  nothing (dormant neurons), and each reset neuron can learn again from a zero output.
  """
  trees = list(trees)
  if len(trees) != 2:
    raise ValueError(f"reset_neurons takes (θ, θ_base); got {len(trees)} trees")
  tuned, base = trees
  if mode not in ("base", "reinit"):
    raise ValueError(f"reset_neurons mode {mode!r} is not known; use 'base' or 'reinit'")
  if scores is None:
    if score == "drift":
      scores = drift_scores(tuned, base)
    elif score == "magnitude":
      scores = magnitude_scores(tuned)
    elif score == "random":
      shape = _mlp(tuned)[DOWN].shape[:2]
      scores = jax.random.uniform(jax.random.key(seed), shape)
    else:
      raise ValueError(f"reset_neurons score {score!r} is not known; use drift, magnitude, random")
  chosen = select(jnp.asarray(scores), fraction)  # [L, F]
  keys = dict(zip((GATE, UP), jax.random.split(jax.random.key(seed + 1), 2)))
  b = _mlp(base)

  def one(path, t):
    name = leaf_name(path)
    if name not in (GATE, UP, DOWN):
      return t
    if name == DOWN:
      mask = chosen[:, :, None]
      new = b[DOWN] if mode == "base" else jnp.zeros_like(t)
    else:
      mask = chosen[:, None, :]
      if mode == "base":
        new = b[name]
      else:
        scale = jnp.std(b[name].astype(jnp.float32), axis=(1, 2), keepdims=True)
        new = (jax.random.normal(keys[name], t.shape) * scale).astype(t.dtype)
    return jnp.where(mask, new, t)

  return jax.tree_util.tree_map_with_path(one, tuned)


def top_changed_overlap(base, a, b, fraction: float = 0.05) -> float:
  """The share of run ``a``'s top-changed neurons (per layer, the ``fraction`` that drifted most
  from ``base``: :func:`drift_scores`, :func:`select`) that are also among run ``b``'s; about
  ``fraction`` when the two sets are unrelated, 1 when they coincide."""
  sel_a = select(drift_scores(a, base), fraction)
  sel_b = select(drift_scores(b, base), fraction)
  n = int(jnp.sum(sel_a))
  if n == 0:
    raise ValueError(f"fraction={fraction} selects no neuron; use a larger fraction")
  return float(jnp.sum(sel_a & sel_b)) / n


__all__ = ["drift_scores", "magnitude_scores", "reset_neurons", "select", "top_changed_overlap"]
