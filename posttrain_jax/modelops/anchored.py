"""Base-anchored operators: fusion of a tuned model with its base, and sparse rollback of the
coordinates that moved most.

Both take ``trees = (first, second)`` in the order a ``modelop`` stage lists its inputs and
return one tree of the same structure and dtypes; a leaf they leave alone is returned bit for
bit. Leaves are addressed by their path joined with ``/`` without the ``value`` suffix of an
``nnx.State`` (``"layers/down"``, ``"embed"``); stacked layers are the leading axis of every
leaf under ``layers``.
"""

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def leaf_name(path) -> str:
  """``"layers/down"`` for the key path of ``params['layers']['down'].value``."""
  parts = []
  for k in path:
    name = getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))
    if str(name) != "value":
      parts.append(str(name))
  return "/".join(parts)


def _pair(trees: Sequence, op: str):
  trees = list(trees)
  if len(trees) != 2:
    raise ValueError(f"{op} combines two parameter trees (inputs=(A, B)); got {len(trees)}")
  a, b = trees
  if jax.tree.structure(a) != jax.tree.structure(b):
    raise ValueError(f"{op}: the two parameter trees differ in structure (not the same model)")
  return a, b


def _alpha_for(name: str, default: float, modules: Mapping) -> float:
  """The module weight: ``modules``'s value for a path component of ``name``, else
  ``default``."""
  hits = [k for k in modules if k in name.split("/")]
  return float(modules[max(hits, key=len)]) if hits else float(default)


def fuse(
  trees: Sequence,
  *,
  alpha: float = 0.5,
  modules: Mapping | None = None,
  layers: Sequence[float] = (),
) -> object:
  """Base-anchored fusion ``θ' = θ_base + α (θ - θ_base)``, with ``trees = (θ_base, θ)``.

  ``α`` is ``alpha`` everywhere, per module where ``modules`` names it (``{"down": 0.0,
  "embed": 1.0}``: a path component -> α), and per layer for stacked leaves where ``layers``
  gives one α per layer (replacing ``alpha`` there; a module named in ``modules`` multiplies
  it). α = 0 returns the base's values and
  α = 1 the tuned model's, bit for bit; Rejuvenation's fusion (methods_A.md section 4) and
  model soups' two-model interpolation are this operator.
  """
  base, tuned = _pair(trees, "fuse")
  modules = dict(modules or {})
  layer_alpha = tuple(float(x) for x in layers)

  def one(path, b, t):
    name = leaf_name(path)
    stacked = name.startswith("layers/") and layer_alpha
    a = _alpha_for(name, 1.0 if stacked else alpha, modules)
    if stacked:
      if b.shape[0] != len(layer_alpha):
        raise ValueError(
          f"fuse: layers has {len(layer_alpha)} values but {name} stacks {b.shape[0]} layers"
        )
      a = jnp.asarray(layer_alpha, jnp.float32).reshape((-1,) + (1,) * (b.ndim - 1)) * a
    elif a == 0.0:
      return jnp.copy(b)
    elif a == 1.0:
      return jnp.copy(t)
    a = jnp.asarray(a, jnp.float32)
    mixed = (b.astype(jnp.float32) + a * (t.astype(jnp.float32) - b.astype(jnp.float32))).astype(
      b.dtype
    )
    return jnp.where(a == 0.0, b, jnp.where(a == 1.0, t, mixed))

  return jax.tree_util.tree_map_with_path(one, base, tuned)


def _scores(tuned, anchor, score: str, seed: int, origin=None):
  if score == "conflict":  # methods_A.md section 14 (derived): opposed moves of A and B
    if origin is None:
      raise ValueError(
        "rollback score 'conflict' needs three trees (inputs=(B, A, start of A)): the "
        "update of A is A - start, the update of B is B - A"
      )
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731

    def conflict(t, a, o):
      d_b, d_a = f32(t) - f32(a), f32(a) - f32(o)
      return jnp.where(jnp.sign(d_a) * jnp.sign(d_b) < 0, jnp.abs(d_b) * jnp.abs(d_a), 0.0)

    return jax.tree.map(conflict, tuned, anchor, origin)
  if score == "drift":
    return jax.tree.map(
      lambda t, a: jnp.abs(t.astype(jnp.float32) - a.astype(jnp.float32)), tuned, anchor
    )
  if score == "random":  # the control: as many coordinates, chosen blindly
    leaves, treedef = jax.tree.flatten(tuned)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(
      treedef, [jax.random.uniform(k, x.shape) for k, x in zip(keys, leaves)]
    )
  raise ValueError(
    f"rollback score {score!r} is not known; use 'drift', 'random', 'conflict' or scores="
  )


def rollback(
  trees: Sequence,
  *,
  fraction: float,
  score: str = "drift",
  scores=None,
  seed: int = 0,
) -> object:
  """Sparse rollback: the ``fraction`` of all coordinates with the highest score set back to
  the anchor, with ``trees = (θ, θ_anchor)``; every other coordinate keeps θ's value bit for bit.

  ``score``: ``drift`` (|θ - θ_anchor|, the coordinates that moved most), ``random`` (a
  control with as many coordinates) or ``conflict`` (methods_A.md section 14, derived: with
  ``trees = (θ_B, θ_A, θ_0)``, ``|Δ_B| · |Δ_A|`` where ``Δ_B = θ_B - θ_A`` and ``Δ_A = θ_A -
  θ_0`` have opposite signs, 0 elsewhere); ``scores``: a tree of per-coordinate scores instead
  (e.g. the Fisher-weighted damage ``F_A ⊙ Δ_B²``, from Python). Exactly
  ``round(fraction · N)`` coordinates move (ties broken by position)."""
  trees = list(trees)
  origin = trees.pop() if len(trees) == 3 and score == "conflict" else None
  tuned, anchor = _pair(trees, "rollback")
  if not 0.0 <= float(fraction) <= 1.0:
    raise ValueError(f"rollback fraction={fraction} must lie in [0, 1]")
  s = scores if scores is not None else _scores(tuned, anchor, score, seed, origin)
  leaves, treedef = jax.tree.flatten(s)
  sizes = [int(np.prod(x.shape)) for x in leaves]
  total = sum(sizes)
  k = int(round(float(fraction) * total))
  if k == 0:
    return jax.tree.map(jnp.copy, tuned)
  flat = jnp.concatenate([jnp.ravel(x).astype(jnp.float32) for x in leaves])
  _, idx = jax.lax.top_k(flat, k)
  chosen = jnp.zeros((total,), bool).at[idx].set(True)
  offsets = np.cumsum([0] + sizes)
  masks = [chosen[offsets[i] : offsets[i + 1]].reshape(x.shape) for i, x in enumerate(leaves)]
  masks = jax.tree.unflatten(treedef, masks)
  return jax.tree.map(lambda m, t, a: jnp.where(m, a, t), masks, tuned, anchor)


__all__ = ["fuse", "leaf_name", "rollback"]
