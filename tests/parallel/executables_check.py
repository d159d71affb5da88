"""Subprocess half of test_executables.py: one run of a sharded, donating step through an
installed ExecutableCache (executables.install, then executables.jit as the library's sites
call it) in a fresh process (its own JAX cache folder), printing what happened as JSON.

argv: CACHE_DIR FINGERPRINT MODE [keep], MODE one of
  run     call the step twice through the cache;
  poison  first write, in the step's key, an executable re-serialized from one JAX's cache
          served (it loads but fails on its first call), then run;
  corrupt first overwrite every stored file with junk, then run;
"keep": the step does not donate its state.
"""

import glob
import json
import os
import sys

import jax

jax.config.update("jax_num_cpu_devices", 4)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import serialize_executable  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P

cache_dir, run_fingerprint, mode = sys.argv[1:4]
donate = sys.argv[4:] != ["keep"]
jax.config.update("jax_compilation_cache_dir", cache_dir)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

from posttrain_jax.parallel import executables  # noqa: E402

traced = []
jax.monitoring.register_event_duration_secs_listener(
  lambda event, d, **kw: (
    traced.append(kw.get("fun_name")) if event.endswith("jaxpr_trace_duration") else None
  )
)


def step(state, x, scale):
  """A sort (its comparator is what a re-serialized copy loses) and a sharded matmul."""
  y = jnp.sort(x, axis=1) @ state["w"]
  new = {"w": state["w"] - scale * jnp.mean(y) * jnp.ones_like(state["w"]), "n": state["n"] + 1}
  return new, {"y": y, "total": jnp.sum(y)}


mesh = jax.sharding.Mesh(np.array(jax.devices()[2:4]), ("data",))
rows = NamedSharding(mesh, P("data"))
rep = NamedSharding(mesh, P())
cache = executables.install(
  executables.ExecutableCache(os.path.join(cache_dir, executables.SUBDIR), run_fingerprint)
)
program = executables.jit(
  step,
  name="check.step",
  static=("v1",),
  donate_argnums=(0,) if donate else (),
  out_shardings=(rep, {"y": rows, "total": rep}),
)


def fresh_state():
  return {
    "w": jax.device_put(jnp.arange(12.0).reshape(4, 3) / 10, rep),
    "n": jax.device_put(jnp.int32(0), rep),
  }


x = jax.device_put(jnp.asarray(np.random.default_rng(0).normal(size=(6, 4)), jnp.float32), rows)

if mode in ("poison", "corrupt"):
  state = fresh_state()
  leaves, treedef = jax.tree.flatten((state, x, 0.5))
  path = cache.path(program.key((treedef, tuple(map(executables.leaf_key, leaves)))))
  if mode == "poison":
    served = program.jitted.lower(state, x, 0.5).compile()  # JAX's cache serves it
    blob, in_tree, out_tree = serialize_executable.serialize(served)
    import pickle

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
      pickle.dump(
        {
          "format": executables.FORMAT,
          "executable": blob,
          "in_tree": in_tree,
          "out_tree": out_tree,
          "devices": [2, 3],
        },
        f,
      )
  else:
    for stored in glob.glob(os.path.join(cache.directory, "*", "*.exe")):
      with open(stored, "wb") as f:
        f.write(b"not an executable")

state = fresh_state()
given = state
state, metrics = program(state, x, 0.5)
donated = all(leaf.is_deleted() for leaf in jax.tree.leaves(given))
state, metrics = program(state, x, 0.5)
print(
  json.dumps(
    {
      "w": np.asarray(state["w"]).tolist(),
      "n": int(state["n"]),
      "y": np.asarray(metrics["y"]).tolist(),
      "total": float(metrics["total"]),
      "y_devices": sorted(d.id for d in metrics["y"].sharding.device_set),
      "y_spec": str(metrics["y"].sharding.spec),
      "donated": donated,
      "traced_step": traced.count("step"),
      "stats": cache.stats,
      "files": len(glob.glob(os.path.join(cache.directory, "*", "*.exe"))),
    }
  )
)
