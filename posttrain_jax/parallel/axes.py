"""Logical axis names carried by every parameter, and the per-role rules that map them to a mesh.

Parameters are annotated with logical names (``vocab``, ``embed``, ``mlp``, ``heads``, ``kv_heads``,
``head_dim``, ``norm``, ``layers``); a role's rule table maps each name to a mesh axis (or None).
The trainer shards weights FSDP + tensor-parallel; the sampler keeps them tensor-parallel only.
Activations and batches use ``batch`` (rows over data x fsdp) and the ``act_*`` names (see
parallel.sharding.constrain).
"""

from typing import Sequence

import jax
import numpy as np

MESH_AXES = ("data", "fsdp", "tensor")
# Axes a mesh may add to MESH_AXES: 'expert' shards the expert dimension of MoE weights.
OPTIONAL_AXES = ("expert",)

LOGICAL_AXES = (
  "vocab",
  "embed",
  "mlp",
  "heads",
  "kv_heads",
  "head_dim",
  "norm",
  "layers",
  "expert",
)

# Activations: rows over data x fsdp, the residual stream replicated along its width, heads /
# MLP hidden / vocabulary over the tensor axis (as the weights that produce them).
_ACTIVATIONS = (
  ("batch", ("data", "fsdp")),
  ("act_length", None),
  ("act_embed", None),
  ("act_heads", "tensor"),
  ("act_kv_heads", "tensor"),
  ("act_mlp", "tensor"),
  ("act_vocab", "tensor"),
)

RULES: dict[str, tuple[tuple[str, str | None], ...]] = {
  "trainer": (
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("norm", None),
    ("layers", None),
    ("expert", "expert"),
  )
  + _ACTIVATIONS,
  "sampler": (
    ("vocab", "tensor"),
    ("embed", None),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("norm", None),
    ("layers", None),
    ("expert", "expert"),
  )
  + _ACTIVATIONS,
}


def rules_for_role(role: str):
  """The logical-axis rule table of ``role`` ('trainer' or 'sampler')."""
  if role not in RULES:
    raise ValueError(f"unknown mesh role {role!r}; valid roles: {', '.join(sorted(RULES))}")
  return RULES[role]


def make_mesh(
  shape: Sequence[int], axes: Sequence[str] = MESH_AXES, devices=None
) -> jax.sharding.Mesh:
  """A mesh over ``devices`` (default all) with Auto axis types; one ``-1`` means "the rest".

  ``jax.make_mesh`` defaults to Explicit axes in JAX 0.10, which breaks gathers in embedding
  lookups; this helper always asks for Auto (research/scale.md, pitfall 1).
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = list(shape)
  if len(shape) != len(axes):
    raise ValueError(f"mesh shape {shape} has {len(shape)} entries for axes {tuple(axes)}")
  if shape.count(-1) > 1:
    raise ValueError(f"mesh shape {shape}: at most one -1 is allowed")
  known = int(np.prod([s for s in shape if s != -1]))
  if -1 in shape:
    if len(devices) % known:
      raise ValueError(f"mesh shape {shape} does not divide {len(devices)} devices")
    shape[shape.index(-1)] = len(devices) // known
  if int(np.prod(shape)) != len(devices):
    raise ValueError(f"mesh shape {shape} needs {int(np.prod(shape))} devices, have {len(devices)}")
  auto = (jax.sharding.AxisType.Auto,) * len(axes)
  return jax.make_mesh(tuple(shape), tuple(axes), axis_types=auto, devices=devices)
