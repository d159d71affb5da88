"""Runs the trainer and sampler on 8 fake CPU devices and prints one JSON line of results.

Used by test_mesh.py / test_mesh_checkpoint.py in a subprocess (the device count must be set
before JAX starts). Modes:

  shard  PartitionSpecs of parameters and Adam state on a (1, 4, 2) mesh; one sharded RL update
         against the single-device update on the same batch; sharded greedy sampling against
         single-device sampling; the sampler's weight copy (layout, resyncs).
  ckpt   SFT steps on mesh A (1, 4, 2), a checkpoint, then the same steps continued after
         restoring onto mesh A, onto mesh B (2, 2, 2) and onto one device, against an
         uninterrupted run; restore_params_single_device.

Usage: mesh_check.py MODE WORKDIR
"""

import dataclasses
import json
import os
import sys

import jax

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_default_matmul_precision", "highest")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from posttrain_jax import io as ptio  # noqa: E402
from posttrain_jax import (
  models,  # noqa: E402
  parallel,  # noqa: E402
  rollout,  # noqa: E402
)
from posttrain_jax.train import (
  inputs,
  updates,  # noqa: E402
)
from posttrain_jax.train import placement as placement_lib  # noqa: E402
from posttrain_jax.train import state as state_lib  # noqa: E402

V, EOS, PAD = 32, 1, 0
CONTROLS = {"kl_coef": jnp.float32(0.1), "dcmdp_lam": jnp.float32(0.0)}


def _model():
  cfg = models.preset("nano", vocab_size=V)
  return nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0)))


def _name(path) -> str:
  keys = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
  return "/".join(k for k in keys if k != "value")


def _specs(tree) -> dict:
  return {
    _name(p): str(tuple(x.sharding.spec)) for p, x in jax.tree_util.tree_leaves_with_path(tree)
  }


def _single(tree):
  return jax.device_put(jax.tree.map(np.asarray, tree), jax.devices()[0])


def _max_rel(a, b) -> float:
  """max over leaves of ||a - b|| / ||b|| (0 where both are 0)."""
  out = 0.0
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    diff, norm = np.linalg.norm(x - y), np.linalg.norm(y)
    out = max(out, float(diff / norm) if norm else float(diff))
  return out


def _prompts(rows):
  ids = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [4], [7, 7, 8, 9]]
  tokens, mask = rollout.left_pad(ids, PAD)
  return np.repeat(tokens, rows // 4, 0), np.repeat(mask, rows // 4, 0)


def check_shard(out: dict) -> None:
  graphdef, params = _model()
  mesh = parallel.make_mesh((1, 4, 2))
  place = placement_lib.Placement(mesh)
  tx = state_lib.make_optimizer(lr=1e-3, steps=10, weight_decay=0.01)
  state = place.init_state(params, tx)
  out["param_specs"] = _specs(state.params)
  out["opt_specs"] = _specs(state.opt_state)
  out["devices"] = len(jax.tree.leaves(state.params)[0].sharding.device_set)

  # (b) one RL update (2 minibatches), sharded vs single device, on the same batch.
  rows = 16
  tokens, mask = _prompts(rows)
  sample = rollout.make_sampler(graphdef, rollout.SamplerConfig(6, EOS, PAD))
  ro = sample(_single(params), tokens, mask, jax.random.key(0))
  rng = np.random.default_rng(0)
  batch = inputs.TrainBatch(
    **{
      "tokens": ro.tokens,
      "start": ro.start,
      "mask": ro.completion_mask,
      "old_logprobs": ro.logprobs,
      "behaviour_logprobs": ro.logprobs,
      "is_weights": jnp.ones_like(ro.logprobs),
      "advantages": jnp.asarray(rng.normal(size=rows), jnp.float32),
      "ref_logprobs": ro.logprobs - 0.1,
      "rewards": jnp.zeros(rows),
      "group": jnp.repeat(jnp.arange(4), 4),
      "valid": jnp.ones(rows),
    }
  )
  batch = jax.tree.map(np.asarray, batch)
  S = ro.prompt_len
  out["update"] = {}
  # The rows are 4 groups of 4 rows sharing a prompt (_prompts), so the shared-prompt forward
  # (group=4) applies too; its sharded update is checked against the single-device per-row one.
  runs = {"minibatches=1": (1, 0), "minibatches=2": (2, 0), "shared_prefix": (1, 4)}
  for name, (minibatches, group) in runs.items():
    cfg = updates.RLLossConfig(kl_coef=0.1, entropy_coef=0.01, minibatches=minibatches)
    single = updates.make_rl_update(graphdef, tx, S, cfg)
    s1, m1 = single(state_lib.init_state(_single(params), tx), batch, CONTROLS, jax.random.key(1))
    sharded = updates.make_rl_update(
      graphdef,
      tx,
      S,
      dataclasses.replace(cfg, group=group),
      shardings=place.step_shardings(place.state_shardings(params, tx), rows),
    )
    s8, m8 = sharded(place.init_state(params, tx), batch, CONTROLS, jax.random.key(1))
    m8 = {k: v for k, v in m8.items() if k != "train/prefix_mismatch"}
    out["update"][name] = {
      "params_rel": _max_rel(s8.params, s1.params),
      "opt_rel": _max_rel(s8.opt_state, s1.opt_state),
      "metrics_rel": max(_max_rel(m8[k], m1[k]) for k in m1),
      "step": int(s8.step),
      "specs_kept": (
        _specs(s8.params) == out["param_specs"] and _specs(s8.opt_state) == out["opt_specs"]
      ),
      "metrics_replicated": all(m.sharding.is_fully_replicated for m in m8.values()),
    }

  # (c) greedy sampling: sampler layout (TP only) on the mesh vs one device.
  greedy_cfg = rollout.SamplerConfig(8, EOS, PAD, temperature=0.0)
  tokens, mask = _prompts(8)
  ro1 = rollout.make_sampler(graphdef, greedy_cfg)(_single(params), tokens, mask, jax.random.key(2))
  weights = rollout.InferenceWeights("float32", mesh=mesh)
  copy = weights(state.params, 0)
  again = weights(state.params, 0)
  ro8 = rollout.make_sampler(graphdef, greedy_cfg, mesh=mesh)(
    copy, tokens, mask, jax.random.key(2), 7
  )
  bf16 = rollout.InferenceWeights("bfloat16", mesh=mesh)
  bf16(state.params, 0)
  bf16(state.params, 0)
  bf16(state.params, 1)
  out["sample"] = {
    "tokens_equal": bool(np.array_equal(np.asarray(ro1.tokens), np.asarray(ro8.tokens))),
    "logprobs_diff": float(np.max(np.abs(np.asarray(ro1.logprobs) - np.asarray(ro8.logprobs)))),
    "lengths": np.asarray(ro8.lengths).tolist(),
    "rows_spec": str(tuple(ro8.tokens.sharding.spec)),
    "policy_version": np.asarray(ro8.policy_version).tolist(),
    "copy_specs": _specs(copy),
    "float32_copy_is_cached": again is copy,
    "bf16_resyncs": bf16.resyncs,
  }


def _sft_batches(n, rows=16, length=12):
  rng = np.random.default_rng(3)
  out = []
  for _ in range(n):
    tokens = rng.integers(2, V, (rows, length)).astype(np.int32)
    mask = (rng.random((rows, length)) < 0.8).astype(np.float32)
    out.append({"tokens": tokens, "loss_mask": mask})
  return out


def _run_sft(step_fn, state, batches):
  losses = []
  for b in batches:
    state, m = step_fn(state, b)
    losses.append(float(m["loss/nll"]))
  return state, losses


def check_ckpt(out: dict, workdir: str) -> None:
  graphdef, params = _model()
  tx = state_lib.make_optimizer(lr=1e-2, steps=10, weight_decay=0.01)
  batches = _sft_batches(4)
  place_a = placement_lib.Placement(parallel.make_mesh((1, 4, 2)))
  place_b = placement_lib.Placement(parallel.make_mesh((2, 2, 2)))

  def sft(place):
    return updates.make_sft_step(
      graphdef, tx, shardings=place.step_shardings(place.state_shardings(params, tx), 16)
    )

  step_a, step_b = sft(place_a), sft(place_b)
  _, uninterrupted = _run_sft(step_a, place_a.init_state(params, tx), batches)
  state, first = _run_sft(step_a, place_a.init_state(params, tx), batches[:2])
  saved_params = jax.tree.map(np.asarray, state.params)
  ckpt = ptio.Checkpointer(os.path.join(workdir, "ckpt"), async_save=True)
  ckpt.save(2, state, {"step": 2})
  ckpt.close()

  results = {}
  for name, place, step_fn in (("mesh_a", place_a, step_a), ("mesh_b", place_b, step_b)):
    target = place.init_state(params, tx)  # placed on this mesh: restore reshards onto it
    ckpt = ptio.Checkpointer(os.path.join(workdir, "ckpt"))
    restored, meta = ckpt.restore(target)
    ckpt.close()
    specs = {"params": _specs(restored.params), "opt": _specs(restored.opt_state)}
    _, rest = _run_sft(step_fn, restored, batches[2:])
    meshes = {str(dict(x.sharding.mesh.shape)) for x in jax.tree.leaves(restored)}
    results[name] = {"losses": first + rest, "meta": meta, "specs": specs, "meshes": sorted(meshes)}
  single_target = state_lib.init_state(_single(params), tx)
  restored, _ = ptio.checkpoint.restore_single_device(os.path.join(workdir, "ckpt"), single_target)
  devices = {str(d) for x in jax.tree.leaves(restored) for d in x.sharding.device_set}
  _, rest = _run_sft(updates.make_sft_step(graphdef, tx), restored, batches[2:])
  results["one_device"] = {"losses": first + rest, "devices": sorted(devices)}
  pure = ptio.checkpoint.restore_params_single_device(os.path.join(workdir, "ckpt"))
  flat = {_name(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(pure)}
  want = {_name(p): x for p, x in jax.tree_util.tree_leaves_with_path(saved_params)}
  results["pure_params_equal"] = sorted(flat) == sorted(want) and all(
    np.array_equal(flat[k], want[k]) for k in want
  )
  results["pure_params_devices"] = sorted(
    {str(d) for x in jax.tree.leaves(pure) for d in x.sharding.device_set}
  )
  out.update(results, uninterrupted=uninterrupted)


def main(mode: str, workdir: str) -> None:
  out = {"mode": mode, "device_count": jax.device_count()}
  {"shard": check_shard, "ckpt": lambda o: check_ckpt(o, workdir)}[mode](out)
  print(json.dumps(out))


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2])
