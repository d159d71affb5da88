"""The sampler on a mesh of its own (config.sampler_mesh) over 2 CPU devices (config.cpu_devices),
the trainer on device 0; prints one JSON line. Run by test_sampler_mesh.py in a subprocess: the
device count is set from the config, before JAX starts (what posttrain_jax.main does).

  1. The same sampler call (weights, prompts, key) on the trainer's one-device mesh and on the
     two-device sampler mesh: tokens and log-probs.
  2. The quickstart smoke run (RL + eval, 4 steps) with the sampler mesh and with the shared
     mesh, from the same seed: per-step records.
  3. Errors: a device index past the devices, cpu_devices after the backend started.

Usage: sampler_mesh_check.py WORKDIR
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rl_fixtures  # noqa: E402

from posttrain_jax import methods as methods_lib
from posttrain_jax.train import context as context_lib  # noqa: E402
from posttrain_jax.train.validate import ConfigError  # noqa: E402


def own_mesh_config(steps: int = 4):
  c = rl_fixtures.smoke_config(steps)
  c.stages = ("rl", "eval")
  c.cpu_devices = 2
  c.mesh.update(shape=(1, 1, 1), devices=(0,))
  c.sampler_mesh.shape = (2, 1, 1)
  return c


def main(workdir: str) -> None:
  from posttrain_jax import envs

  get_env = envs.get_env  # a coin-flip verifier: the smoke model's groups have a signal
  envs.get_env = lambda name: rl_fixtures.CoinEnv(get_env(name))
  config = own_mesh_config()
  context_lib.apply_cpu_devices(config)  # before JAX starts: 2 CPU devices
  import jax
  import jax.numpy as jnp
  import ml_collections
  import numpy as np

  from posttrain_jax import rollout
  from posttrain_jax.train import generation
  from posttrain_jax.train import placement as placement_lib

  out = {"devices": jax.device_count()}

  # 1. One sampler call on each mesh.
  ctx = methods_lib.make_context(config, os.path.join(workdir, "ctx"))
  out["trainer_devices"] = sorted(d.id for d in ctx.mesh.devices.flat)
  out["sampler_devices"] = sorted(d.id for d in ctx.rollout_mesh.devices.flat)
  scfg = ctx.sampler_config(temperature=1.0, max_new_tokens=8)
  problems = ctx.env.sample(jax.random.key(3), 8, level=config.env.level, split="train")
  _, (tokens, mask) = generation.local_problems(ctx, problems, 8)
  key = jax.random.key(11)
  res = {}
  for name, mesh in (("shared", ctx.mesh), ("own", ctx.rollout_mesh)):
    weights = rollout.InferenceWeights(mesh=mesh)(ctx.init_params, 0)
    ro = rollout.make_sampler(ctx.graphdef, scfg, mesh=mesh)(weights, tokens, mask, key)
    res[name] = ro
    out[f"{name}_rows_devices"] = sorted(d.id for d in ro.tokens.sharding.device_set)
  out["tokens_equal"] = bool(
    np.array_equal(np.asarray(res["shared"].tokens), np.asarray(res["own"].tokens))
  )
  out["logprobs_diff"] = float(
    np.max(np.abs(np.asarray(res["shared"].logprobs) - np.asarray(res["own"].logprobs)))
  )
  moved = ctx.placement.rows_here(res["own"], 8)
  out["moved_devices"] = sorted(
    {d.id for x in jax.tree.leaves(moved) for d in x.sharding.device_set}
  )
  # The weight copy on the sampler's mesh: a cached copy that survives the trainer's donation
  # on other devices (float32: a transfer to device 1) or cast on shared ones (bfloat16); a
  # float32 "copy" onto shared devices reuses the trainer's buffers there, so it is redone at
  # each call and never cached (like the trainer's own arrays).
  other = placement_lib.mesh_from_config(
    ml_collections.ConfigDict(dict(shape=(1, 1, 1), axes=("data", "fsdp", "tensor"), devices=(1,)))
  )
  for name, mesh, precision in (
    ("overlapping_bf16", ctx.rollout_mesh, "bfloat16"),
    ("disjoint", other, "float32"),
  ):
    params = jax.tree.map(jnp.copy, ctx.init_params)
    weights = rollout.InferenceWeights(precision, mesh=mesh)
    copy = weights(params, 0)
    out[f"cached_{name}"] = weights(params, 0) is copy and weights.resyncs == 1
    jax.tree.map(lambda x: x.delete(), params)
    out[f"copy_survives_delete_{name}"] = bool(
      all(not x.is_deleted() for x in jax.tree.leaves(copy))
    )
    out[f"copy_devices_{name}"] = sorted(
      {d.id for x in jax.tree.leaves(copy) for d in x.sharding.device_set}
    )
  weights = rollout.InferenceWeights(mesh=ctx.rollout_mesh)
  first, again = weights(ctx.init_params, 0), weights(ctx.init_params, 0)
  out["overlapping_f32"] = {
    "resyncs": weights.resyncs,
    "cached": weights._params is not None,
    "devices": sorted({d.id for x in jax.tree.leaves(again) for d in x.sharding.device_set}),
    "equal": bool(
      all(
        np.array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(ctx.init_params))
      )
    ),
  }

  # 2. The smoke run (RL + eval) with the sampler's own mesh, then with the shared mesh.
  runs = {}
  for name in ("own", "shared"):
    c = own_mesh_config()
    if name == "shared":
      c.sampler_mesh.shape = ()
    wd = os.path.join(workdir, name)
    summary = methods_lib.run(c, wd)
    runs[name] = {
      "records": [r for r in rl_fixtures.records(wd) if r["step"] > 0],
      "summary": summary,
    }
  out["runs"] = runs

  # 3. Errors.
  errors = {}
  bad = own_mesh_config()
  bad.sampler_mesh.devices = (0, 5)
  try:
    methods_lib.make_context(bad, os.path.join(workdir, "bad"))
  except ConfigError as e:
    errors["device_index"] = str(e)
  late = own_mesh_config()
  late.cpu_devices = 3
  try:
    context_lib.apply_cpu_devices(late)
  except ConfigError as e:
    errors["late"] = str(e)
  out["errors"] = errors
  print(json.dumps(out))


if __name__ == "__main__":
  main(sys.argv[1])
