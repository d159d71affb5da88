"""Loads an HF folder onto a (2, 2, 2) mesh of 8 fake CPU devices and onto one device; prints
one JSON line with the logits differences and each parameter's PartitionSpec. Used by
test_hf_sharded.py in a subprocess (the device count must be set before JAX starts).

Usage: hf_sharded_check.py HF_DIR TOKENS.npy REFERENCE_LOGITS.npy
"""

import json
import sys

import jax

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_default_matmul_precision", "highest")

import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from posttrain_jax import parallel  # noqa: E402
from posttrain_jax.models import hf  # noqa: E402


def _logits(model, tokens):
  graphdef, state = nnx.split(model)
  fn = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t).logits)
  return np.asarray(fn(state, tokens))


def main(path, tokens_file, reference_file):
  tokens = np.load(tokens_file)
  reference = np.load(reference_file)
  mesh = parallel.make_mesh((2, 2, 2))
  out = {"devices": jax.device_count()}
  single, _ = hf.load_pretrained(path, dtype="float32")
  single_state = nnx.to_flat_state(nnx.state(single))
  for role in ("trainer", "sampler"):
    model, _ = hf.load_pretrained(path, dtype="float32", mesh=mesh, rules=role)
    state = nnx.state(model)
    with nnx.logical_axis_rules(parallel.rules_for_role(role)):
      expected = nnx.get_partition_spec(state)
    specs, param_diff = {}, 0.0
    for (p, var), (_, want), (_, ref) in zip(
      nnx.to_flat_state(state), nnx.to_flat_state(expected), single_state
    ):
      arr = var.get_value()
      name = "/".join(map(str, p))
      specs[name] = {
        "actual": str(tuple(arr.sharding.spec)),
        "expected": str(tuple(want.get_value())),
        "devices": len(arr.sharding.device_set),
        "shard": list(arr.addressable_shards[0].data.shape),
      }
      param_diff = max(
        param_diff, float(np.max(np.abs(np.asarray(arr) - np.asarray(ref.get_value()))))
      )
    out[role] = {
      "specs": specs,
      "param_diff": param_diff,
      "logits_vs_single": float(np.max(np.abs(_logits(model, tokens) - _logits(single, tokens)))),
      "logits_vs_hf": float(np.max(np.abs(_logits(model, tokens) - reference))),
    }
  rules = parallel.rules_for_role("trainer")
  out["fallback"] = [
    str(tuple(hf.logical_sharding(names, shape, mesh, rules).spec))
    for names, shape in [
      (("kv_heads", "mlp"), (3, 8)),  # 3 % 2: replicated
      (("embed", "embed"), (4, 4)),  # fsdp used once
      (("vocab", "nope"), (4, 4)),
    ]
  ]  # unknown name
  print(json.dumps(out))


if __name__ == "__main__":
  main(*sys.argv[1:4])
