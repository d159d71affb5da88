"""One process of a 2-process run on this machine (gloo CPU collectives, 2 fake CPU devices per
process): initialises jax.distributed through posttrain_jax.main.init_distributed, runs 2 RL
steps of the quickstart smoke config (as tests/train/test_rl_names.py shrinks it; an entropy
bonus makes the untrained policy's update non-zero) on a (2, 2, 1) mesh: data across the
processes, FSDP within (so the sampler reads a resharded copy). Then it restores the RL stage's final parameters from the
checkpoint both processes saved (onto the same mesh, from both processes) and writes this
process's replica of them, and of the initial parameters, to WORKDIR/params_pPID.npz.
Used by test_multihost.py.

Usage: multihost_check.py PROCESS_ID NUM_PROCESSES COORDINATOR WORKDIR [STAGES]
  STAGES: comma-separated, default "rl" ("pretrain,rl" also runs 2 pretraining steps).
"""

import importlib.util
import json
import os
import sys

import jax

from posttrain_jax import methods as methods_lib

jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_platforms", "cpu")

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def smoke_config(pid: int, nproc: int, coordinator: str, stages: str):
  spec = importlib.util.spec_from_file_location(
    "qs", os.path.join(REPO, "experiments", "quickstart.py")
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config("smoke")
  c.stages = tuple(stages.split(","))
  c.progress = False
  c.pretrain.update(steps=2, eval_every=2, checkpoint_every=2)
  c.rl.update(steps=2, eval_every=0, checkpoint_every=2, entropy_coef=0.01)
  c.mesh.shape = (2, 2, 1)
  c.distributed.update(
    coordinator_address=coordinator, num_processes=nproc, process_id=pid, initialization_timeout=120
  )
  return c


def _replica(tree) -> dict:
  """This process's full copy of every (replicated across processes) array of ``tree``."""
  import numpy as np

  out = {}
  for path, x in jax.tree_util.tree_leaves_with_path(tree):
    name = "/".join(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))
    full = np.zeros(x.shape, x.dtype)
    for shard in x.addressable_shards:
      full[shard.index] = np.asarray(shard.data)
    out[name] = full
  return out


def main(pid: int, nproc: int, coordinator: str, workdir: str, stages: str = "rl") -> None:
  import numpy as np

  from posttrain_jax import io as ptio
  from posttrain_jax import main as main_lib
  from posttrain_jax import parallel

  config = smoke_config(pid, nproc, coordinator, stages)
  assert main_lib.init_distributed(config)
  assert jax.process_count() == nproc and jax.device_count() == 2 * nproc
  methods_lib.run(config, workdir)
  # Restore the final parameters every process saved, onto the run's mesh, from all processes.
  ctx = methods_lib.make_context(config, workdir)
  ckpt = ptio.Checkpointer(os.path.join(workdir, "rl", "final"), max_to_keep=1)
  params, _ = ckpt.restore(ctx.init_params)
  ckpt.close()
  arrays = {f"final/{k}": v for k, v in _replica(params).items()}
  arrays.update({f"init/{k}": v for k, v in _replica(ctx.init_params).items()})
  np.savez(os.path.join(workdir, f"params_p{pid}.npz"), **arrays)
  info = {
    "process": jax.process_index(),
    "processes": jax.process_count(),
    "devices": jax.device_count(),
    "local_devices": jax.local_device_count(),
    "rows": ctx.placement.local_rows(config.rl.prompts_per_step * config.rl.group_size),
    "primary": parallel.is_primary(),
  }
  with open(os.path.join(workdir, f"info_p{pid}.json"), "w") as f:
    json.dump(info, f)
  parallel.barrier("multihost_check_done")
  jax.distributed.shutdown()


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], *sys.argv[5:6])
