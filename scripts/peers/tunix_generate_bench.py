#!/usr/bin/env python
"""tunix vanilla Sampler (JAX), generation only, on the benchmark workloads' model and prompts:
prompts x G sequences of 8 prompt tokens -> exactly max_new new tokens, temperature-1 sampling
without top-k/top-p, KV cache, jitted prefill + decode, fp32. CPU.

    .venv-tunix/bin/python scripts/peers/tunix_generate_bench.py --workload tiny --steps 11 --repeats 3

One iteration = one sampler call on the whole batch; the first call of each run (which holds the
jit compilation in run 0) is excluded from the statistics. The length is forced by an EOS id
outside the vocabulary (tunix's sampler has no min_new_tokens), so no sequence stops early.
"""

import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common_tiny as ct  # noqa: E402

args = ct.parse_args(__doc__.splitlines()[0], grpo=False, default_steps=11)

from importlib.metadata import version  # noqa: E402

import jax  # noqa: E402
from tunix.generate import sampler as sampler_lib  # noqa: E402
from tunix.models.dummy_model_creator import create_dummy_model  # noqa: E402
from tunix.models.qwen2 import model as qwen2_lib  # noqa: E402

M = args.model
tok = ct.build_hf_tokenizer()
batch = args.prompts * args.group
prompts = [p for p, _ in ct.make_problems(args.prompts, seed=1) for _ in range(args.group)]
mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
cfg = qwen2_lib.ModelConfig(
  vocab_size=len(tok),
  num_layers=M["layers"],
  embed_dim=M["hidden"],
  hidden_dim=M["mlp"],
  num_heads=M["heads"],
  head_dim=M["head_dim"],
  num_kv_heads=M["kv_heads"],
  rope_theta=10000,
  norm_eps=1e-6,
  use_tied_embedding=True,
)
CACHE = ct.PROMPT_LEN + args.max_new + 8


def gen(sampler, seed):
  out = sampler(
    input_strings=prompts,
    max_generation_steps=args.max_new,
    max_prompt_length=ct.PROMPT_LEN,
    temperature=ct.TEMPERATURE,
    top_p=1.0,
    top_k=None,
    eos_tokens=[tok.eos_token_id] if args.allow_eos else [len(tok) + 7],
    seed=seed,
  )
  jax.block_until_ready(out.tokens)
  return out


if __name__ == "__main__":
  vers = dict(jax=jax.__version__, flax=version("flax"), tunix=version("google-tunix"))
  print(f"{vers} devices={jax.devices()} batch={batch} vocab={len(tok)}", flush=True)
  runs = []
  for r in range(args.repeats):
    model = create_dummy_model(qwen2_lib.Qwen2, cfg, mesh=mesh, random_seed=r, scale=0.02)
    sampler = sampler_lib.Sampler(
      model,
      tok,
      sampler_lib.CacheConfig(
        cache_size=CACHE, num_layers=M["layers"], num_kv_heads=M["kv_heads"], head_dim=M["head_dim"]
      ),
    )
    ts = []
    for i in range(args.steps):
      t = time.perf_counter()
      out = gen(sampler, 1000 * r + i)
      ts.append(time.perf_counter() - t)
      lens = [len(x) for x in out.tokens]
      if not args.allow_eos:
        assert len(lens) == batch and set(lens) == {args.max_new}, (len(lens), set(lens))
    runs.append(ts)
    print(
      f"run {r}: call seconds {[round(x, 4) for x in ts]}; tokens per sequence {sorted(set(lens))}",
      flush=True,
    )
  res = dict(
    bench="tunix_generate",
    peer="tunix",
    **ct.workload_fields(args, grpo=False),
    versions=vers,
    device=str(jax.devices()[0]),
    **ct.summarize(runs),
  )
  res["tokens_per_s"] = batch * args.max_new / res["median_s"]
  ct.emit(res)
