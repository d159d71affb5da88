"""Device meshes, logical-axis rules per role, placement helpers, multi-host init (DESIGN.md 7)."""

from posttrain_jax.parallel import executables
from posttrain_jax.parallel.axes import (
  LOGICAL_AXES,
  MESH_AXES,
  OPTIONAL_AXES,
  RULES,
  make_mesh,
  rules_for_role,
)
from posttrain_jax.parallel.distributed import (
  barrier,
  distributed_settings,
  from_local_rows,
  initialize,
  is_primary,
  local_row_range,
  local_rows,
  to_host,
)
from posttrain_jax.parallel.host import set_cpu_devices
from posttrain_jax.parallel.sharding import (
  abstract_tree,
  activation_sharding,
  batch_sharding,
  constrain,
  constrain_rows,
  logical_sharding,
  logical_spec,
  optimizer_shardings,
  param_shardings,
  put,
  replicated,
  resolve_rules,
  same_placement,
)

__all__ = [
  "LOGICAL_AXES",
  "MESH_AXES",
  "OPTIONAL_AXES",
  "RULES",
  "abstract_tree",
  "activation_sharding",
  "barrier",
  "batch_sharding",
  "executables",
  "constrain",
  "constrain_rows",
  "distributed_settings",
  "from_local_rows",
  "initialize",
  "is_primary",
  "local_row_range",
  "local_rows",
  "logical_sharding",
  "logical_spec",
  "make_mesh",
  "optimizer_shardings",
  "param_shardings",
  "put",
  "replicated",
  "resolve_rules",
  "rules_for_role",
  "same_placement",
  "set_cpu_devices",
  "to_host",
]
