"""Placing arrays on a mesh (DESIGN.md section 7).

* :func:`logical_spec` maps logical axis names to a PartitionSpec through a role's rule table.
  Mesh axes that are missing, of size 1, already used by an earlier dimension, or that do not
  divide the dimension are dropped (that dimension is then less sharded), so any shape places
  on any mesh.
* :func:`param_shardings` reads the names every parameter carries (``nnx.Param(...,
  out_sharding=names)``) and returns a tree of NamedShardings of the same structure.
* :func:`optimizer_shardings` derives the optimiser state's shardings from the parameters':
  every parameter-shaped leaf (Adam's mu / nu ...) gets its parameter's sharding, everything
  else (counts, scalars) is replicated. ``jax.jit(tx.init)`` alone would leave the moments
  replicated (research/scale.md, pitfall 3).
* :func:`constrain` is ``with_sharding_constraint`` on logical names inside an
  :func:`activation_sharding` context, and the identity outside one, so code that calls it
  (e.g. the model at block boundaries) runs unchanged without a mesh.
"""

import contextlib
import contextvars
from typing import Sequence

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from posttrain_jax.parallel.axes import rules_for_role


def resolve_rules(rules) -> tuple:
  """A rule table from a role name ('trainer', 'sampler') or a table itself."""
  return rules_for_role(rules) if isinstance(rules, str) else tuple(rules)


def logical_spec(
  names: Sequence[str | None] | None, shape: Sequence[int], mesh: jax.sharding.Mesh, rules
) -> PartitionSpec:
  """The PartitionSpec of an array of ``shape`` whose dimensions carry logical ``names``.

  A rule maps a name to a mesh axis, a tuple of axes, or None. Of a tuple, the longest prefix
  of usable axes whose sizes divide the dimension is kept.
  """
  table = dict(resolve_rules(rules))
  names = tuple(names or ())
  used, spec = set(), []
  for i, dim in enumerate(shape):
    name = names[i] if i < len(names) else None
    axes = table.get(name) if name is not None else None
    if axes is None:
      spec.append(None)
      continue
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    kept, size = [], 1
    for axis in axes:
      if axis not in mesh.shape or axis in used or mesh.shape[axis] == 1:
        continue
      if dim % (size * mesh.shape[axis]):
        break
      kept.append(axis)
      size *= mesh.shape[axis]
    used.update(kept)
    spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
  return PartitionSpec(*spec)


def logical_sharding(names, shape, mesh: jax.sharding.Mesh, rules) -> NamedSharding:
  """:func:`logical_spec` as a NamedSharding on ``mesh``."""
  return NamedSharding(mesh, logical_spec(names, shape, mesh, rules))


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: jax.sharding.Mesh, rows: int, rules="trainer") -> NamedSharding:
  """Rows (the leading axis) over the rule table's ``batch`` axes, e.g. ('data', 'fsdp'); the
  other dimensions replicated. The same sharding serves arrays of any rank."""
  return logical_sharding(("batch",), (rows,), mesh, rules)


def _is_variable(x) -> bool:
  return isinstance(x, nnx.Variable)


def param_shardings(params, mesh: jax.sharding.Mesh, rules):
  """NamedShardings of ``params`` (an nnx.State of arrays or ShapeDtypeStructs), from the
  logical names in each Variable's ``out_sharding`` metadata; same tree structure as
  ``params``. Leaves that are not Variables (or carry no names) are replicated."""
  leaves, treedef = jax.tree.flatten(params)
  variables = jax.tree.leaves(params, is_leaf=_is_variable)
  if len(variables) != len(leaves):
    raise ValueError("param_shardings expects one array per Variable")
  out = []
  for v in variables:
    if _is_variable(v):
      names, value = v.get_metadata().get("out_sharding"), v.get_value()
    else:
      names, value = None, v
    out.append(logical_sharding(names, np.shape(value), mesh, rules))
  return jax.tree.unflatten(treedef, out)


def optimizer_shardings(
  tx: optax.GradientTransformation, params, shardings, mesh: jax.sharding.Mesh
):
  """Shardings of ``tx.init(params)``: each parameter-shaped leaf gets its parameter's
  sharding (from ``shardings``, the tree :func:`param_shardings` returns), every other leaf is
  replicated. Works on abstract ``params`` (nothing is allocated)."""
  abstract = jax.eval_shape(tx.init, params)
  return optax.tree_map_params(
    tx,
    lambda _, s: s,
    abstract,
    shardings,
    transform_non_params=lambda _: replicated(mesh),
    is_leaf=_is_variable,
  )


def abstract_tree(tree, shardings):
  """``jax.ShapeDtypeStruct`` of every leaf of ``tree``, carrying ``shardings`` (same
  structure): the target with which a checkpoint restores onto a mesh."""
  return jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s), tree, shardings
  )


def _is_sharding(x) -> bool:
  return isinstance(x, jax.sharding.Sharding)


def _to_global(x, sharding):
  """``x`` ready for ``device_put`` onto ``sharding``: an array committed to this process's
  devices cannot move onto other processes' devices, so it goes through the host (its value
  must be the same in every process, as for any host value)."""
  if not isinstance(x, jax.Array) or sharding.is_fully_addressable or not x.is_fully_addressable:
    return x
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    data = jax.device_put(np.asarray(jax.random.key_data(x)), sharding)
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
  return np.asarray(x)


def put(tree, shardings):
  """``jax.device_put`` of ``tree`` (a no-op for arrays already placed so); ``shardings`` is one
  sharding or a tree prefix of ``tree``. Host values, and arrays held by one process, must be
  the same in every process."""
  prefix, treedef = jax.tree.flatten(shardings, is_leaf=_is_sharding)
  parts = treedef.flatten_up_to(tree)
  parts = [jax.tree.map(lambda x, s=s: _to_global(x, s), part) for s, part in zip(prefix, parts)]
  return jax.device_put(jax.tree.unflatten(treedef, parts), shardings)


def same_placement(tree, shardings) -> bool:
  """Whether every array of ``tree`` already lies as ``shardings`` says."""
  return all(
    getattr(x, "sharding", None) is not None and x.sharding.is_equivalent_to(s, np.ndim(x))
    for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings))
  )


# ----------------------------------------------------------------------------------------------
# Activation constraints: no-ops unless an activation_sharding context is active.
# ----------------------------------------------------------------------------------------------
_ACTIVE: contextvars.ContextVar = contextvars.ContextVar(
  "posttrain_jax_activation_sharding", default=None
)


@contextlib.contextmanager
def activation_sharding(mesh: jax.sharding.Mesh | None, rules="trainer"):
  """Within this context (entered while a function is traced), :func:`constrain` pins
  activations to ``mesh`` with ``rules``; ``mesh=None`` leaves them unconstrained."""
  token = _ACTIVE.set(None if mesh is None else (mesh, resolve_rules(rules)))
  try:
    yield
  finally:
    _ACTIVE.reset(token)


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
  """``with_sharding_constraint`` of ``x`` to the layout its logical ``names`` get under the
  active :func:`activation_sharding`; the identity when none is active.

  Names used at block boundaries: ``batch``, ``act_length``, ``act_embed``, ``act_heads``,
  ``act_kv_heads``, ``act_mlp``, ``act_vocab`` (parallel/axes.py).
  """
  active = _ACTIVE.get()
  if active is None:
    return x
  mesh, rules = active
  return jax.lax.with_sharding_constraint(x, logical_sharding(names, x.shape, mesh, rules))


def constrain_rows(tree):
  """:func:`constrain` every array of ``tree`` to rows over the ``batch`` axes."""
  return jax.tree.map(lambda x: constrain(x, ("batch",)) if np.ndim(x) else x, tree)
