"""Device meshes and logical-axis rules (DESIGN.md section 7)."""

from posttrain_jax.parallel.axes import (LOGICAL_AXES, MESH_AXES, RULES, make_mesh,
                                         rules_for_role)

__all__ = ["LOGICAL_AXES", "MESH_AXES", "RULES", "make_mesh", "rules_for_role"]
