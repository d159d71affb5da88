"""Runs objectives jitted with the batch sharded over 8 fake CPU devices and unsharded;
prints one JSON line {name: max abs difference}. Used by test_sharded.py in a subprocess
(the device count must be set before JAX starts)."""

import json

import jax

jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P

from posttrain_jax import (
  objectives,  # noqa: E402
  parallel,  # noqa: E402
)


def main():
  mesh = parallel.make_mesh((8, 1, 1))
  rows = NamedSharding(mesh, P("data"))
  rng = np.random.default_rng(0)
  B, T, P_ = 32, 6, 4
  rewards = jnp.asarray(rng.integers(0, 2, B), jnp.float32)
  group = jnp.asarray(np.repeat(np.arange(P_), B // P_), jnp.int32)
  valid = jnp.ones(B, jnp.float32)
  mask = jnp.asarray(rng.random((B, T)) < 0.8, jnp.float32)
  old = jnp.asarray(np.log(rng.uniform(0.1, 0.9, (B, T))), jnp.float32)
  new = old + jnp.asarray(rng.normal(scale=0.3, size=(B, T)), jnp.float32)
  teacher = old + jnp.asarray(rng.normal(scale=0.5, size=(B, T)), jnp.float32)
  adv = jnp.asarray(rng.normal(size=B), jnp.float32)
  inputs = objectives.AdvantageInputs(rewards, group, valid, mask, old, teacher)
  cases = {}
  for name in ("grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "opd", "gndpo"):
    cases[f"adv/{name}"] = (
      lambda i, n=name: objectives.ADVANTAGES[n](i, num_groups=P_)[0],
      (inputs,),
    )
  for name in ("pass_at_k", "max_at_k", "maxpo"):
    cases[f"adv/{name}"] = (
      lambda i, n=name: objectives.ADVANTAGES[n](i, num_groups=P_, k=2)[0],
      (inputs,),
    )
  for name in sorted(objectives.POLICY_LOSSES):
    fn = objectives.POLICY_LOSSES[name]
    cases[f"loss/{name}"] = (lambda a, b, c, d, f=fn: f(a, b, c, d)[0], (new, old, adv, mask))
    cases[f"grad/{name}"] = (
      lambda a, b, c, d, f=fn: jax.grad(lambda x: f(x, b, c, d)[0])(a),
      (new, old, adv, mask),
    )
  V = 11  # distillation terms: full-vocabulary (plain and chunked) and sampled-token
  logits = jnp.asarray(rng.normal(size=(B, T, V)), jnp.float32)
  t_logits = jnp.asarray(rng.normal(size=(B, T, V)), jnp.float32)
  for name in sorted(objectives.DIVERGENCES):
    fn = objectives.DIVERGENCES[name]
    full = "teacher_logits" in fn.reads
    chunks = (0, 2) if full else (None,)
    for chunk in chunks:
      kw = {} if chunk is None else {"chunk": chunk}
      t = t_logits if full else teacher
      tag = f"{name}" + ("" if chunk is None else f"/chunk{chunk}")
      cases[f"distill/{tag}"] = (
        lambda lp, z, tt, m, f=fn, k=kw: f(lp, z, tt, m, **k)[0],
        (new, logits, t, mask),
      )
      grad_arg = 1 if full else 0
      cases[f"distill_grad/{tag}"] = (
        lambda lp, z, tt, m, f=fn, k=kw, g=grad_arg: jax.grad(
          lambda x: f(*((x, z) if g == 0 else (lp, x)), tt, m, **k)[0]
        )((lp, z)[g]),
        (new, logits, t, mask),
      )
  cases["tis"] = (
    lambda a, b, m: objectives.tis_weights(a, b, m, level="sequence")[0],
    (new, old, mask),
  )
  cases["mismatch"] = (
    lambda a, b, m: objectives.mismatch_metrics(a, b, m)["mismatch/k3"],
    (new, old, mask),
  )
  out = {}
  for name, (fn, args) in cases.items():
    plain = jax.jit(fn)(*args)
    sharded_args = jax.device_put(args, rows)
    sharded = jax.jit(fn)(*sharded_args)
    assert len(jax.tree.leaves(sharded_args)[0].sharding.device_set) == 8
    out[name] = float(
      max(
        np.max(np.abs(np.asarray(a) - np.asarray(b)))
        for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(sharded))
      )
    )
  print(json.dumps(out))


if __name__ == "__main__":
  main()
