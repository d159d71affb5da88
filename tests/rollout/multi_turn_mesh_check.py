"""The multi-turn sampler on 8 fake CPU devices (a (2, 2, 2) mesh: rows over data x fsdp, heads
over tensor) against one device, with observations and a prefix, also scheduled in buckets; prints one JSON line. Run by
test_multi_turn_mesh.py in a subprocess (the device count is fixed when JAX starts)."""

import json
import os
import sys

import jax

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_default_matmul_precision", "highest")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_multi_turn import EOS, PAD, STOP, Recorder, T, V, _prompts  # noqa: E402

from posttrain_jax import (
  models,  # noqa: E402
  parallel,  # noqa: E402
  rollout,  # noqa: E402
)


def main():
  model = models.Decoder(models.preset("nano", vocab_size=V), rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  params = jax.tree.map(lambda x: x, params)
  params["final_norm"][...] = jnp.zeros_like(params["final_norm"][...])  # flat: many calls
  cfg = rollout.SamplerConfig(max_new_tokens=T, eos_id=EOS, pad_id=PAD, decode_chunk=0)
  turns = rollout.TurnConfig(STOP, 4)
  tokens, mask = _prompts()
  B = tokens.shape[0]
  prefix = (np.tile(np.asarray([[15, 16, 17]], np.int32), (B, 1)), np.arange(B) % 4)
  out = {"devices": jax.device_count()}
  single = rollout.make_multi_turn_sampler(graphdef, cfg, turns)
  mesh = parallel.make_mesh((2, 2, 2))
  sharded = rollout.make_multi_turn_sampler(graphdef, cfg, turns, mesh=mesh)
  rec1, rec8 = Recorder(), Recorder()
  a = single(
    jax.device_put(params, jax.devices()[0]),
    tokens,
    mask,
    jax.random.key(7),
    respond=rec1,
    prefix=prefix,
  )
  b = sharded(params, tokens, mask, jax.random.key(7), respond=rec8, prefix=prefix)
  out["calls"] = len(rec1.calls)
  out["same_calls"] = rec1.calls == rec8.calls
  out["tokens_equal"] = bool(np.array_equal(a.tokens, b.tokens))
  out["masks_equal"] = bool(
    np.array_equal(a.completion_mask, b.completion_mask) and np.array_equal(a.env_mask, b.env_mask)
  )
  out["logprobs_diff"] = float(np.max(np.abs(np.asarray(a.logprobs) - np.asarray(b.logprobs))))
  out["row_devices"] = len(b.tokens.sharding.device_set)
  # The bucket scheduler (rollout/buckets.py): batches of 8 rows, partial ones filled up to 8.
  levels = (rollout.Bucket(16, 6, 1), rollout.Bucket(8, 12))
  rec1, rec8 = Recorder(), Recorder()
  one = rollout.BucketScheduler(graphdef, cfg, turns, levels, min_rows=8)
  eight = rollout.BucketScheduler(graphdef, cfg, turns, levels, mesh=mesh)
  c = one(
    jax.device_put(params, jax.devices()[0]),
    tokens,
    mask,
    jax.random.key(8),
    respond=rec1,
    prefix=prefix,
  )
  d = eight(params, tokens, mask, jax.random.key(8), respond=rec8, prefix=prefix)
  out["bucket_batches"] = eight.last_stats.batches
  out["bucket_same"] = bool(
    rec1.calls == rec8.calls
    and np.array_equal(c.tokens, d.tokens)
    and np.array_equal(c.completion_mask, d.completion_mask)
    and np.array_equal(c.env_mask, d.env_mask)
  )
  out["bucket_logprobs_diff"] = float(
    np.max(np.abs(np.asarray(c.logprobs) - np.asarray(d.logprobs)))
  )
  out["bucket_row_devices"] = len(d.tokens.sharding.device_set)
  print(json.dumps(out))


if __name__ == "__main__":
  main()
