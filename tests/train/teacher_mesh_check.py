"""The teacher on a mesh of its own (config.rl.teacher.mesh) over 2 CPU devices: the trainer on
device 0, the teacher stage's model on device 1; prints one JSON line. Run by
test_teacher_mesh.py in a subprocess (the device count is set before JAX starts).

  1. Where the built teacher's parameters and its outputs live.
  2. The same run (pretrain, teacher stage, 2 RL steps of GKD's JSD) with the teacher on its
     own mesh and on the run's: per-step records.
  3. A teacher mesh for a copy of the policy is refused.

Usage: teacher_mesh_check.py WORKDIR
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rl_fixtures  # noqa: E402

from posttrain_jax import methods as methods_lib
from posttrain_jax.methods import validate
from posttrain_jax.train import context as context_lib  # noqa: E402
from posttrain_jax.train.validate import ConfigError


def config(own: bool):
  c = rl_fixtures.smoke_config(2)
  c.stages = ("pretrain", "teacher", "rl")
  c.cpu_devices = 2
  c.mesh.update(shape=(1, 1, 1), devices=(0,))
  c.rl.teacher.update(
    source="stage",
    pretrain_steps=4,
    loss="jsd",
    loss_kwargs={"beta": 0.5},
    pg_during=False,
    temperature=2.0,
  )
  if own:
    c.rl.teacher.mesh.update(shape=(1, 1, 1), devices=(1,))
  return c


def main(workdir: str) -> None:
  context_lib.apply_cpu_devices(config(True))  # before JAX starts: 2 CPU devices
  import jax

  out = {"devices": jax.device_count()}
  runs = {}
  for name in ("own", "shared"):
    path = os.path.join(workdir, name)
    methods_lib.run(config(name == "own"), path)
    runs[name] = rl_fixtures.records(path)
  out["runs"] = runs
  # Where the teacher lives: its parameters and its outputs.
  from posttrain_jax.methods import teacher as teacher_lib
  from posttrain_jax.train import rl as rl_lib

  c = config(True)
  ctx = methods_lib.make_context(c, os.path.join(workdir, "own"))
  teacher = teacher_lib.build(ctx, c.rl)
  out["teacher_param_devices"] = sorted(
    {d.id for x in jax.tree.leaves(teacher.fixed) for d in x.sharding.device_set}
  )
  del rl_lib
  bad = config(True)
  bad.stages = ("pretrain", "rl")
  bad.rl.teacher.update(source="start", rule="every", rule_kwargs={"period": 1})
  try:
    validate(bad)
    out["policy_mesh_error"] = ""
  except ConfigError as e:
    out["policy_mesh_error"] = str(e)
  print(json.dumps(out))


if __name__ == "__main__":
  main(sys.argv[1])
