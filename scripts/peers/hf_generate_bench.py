#!/usr/bin/env python
"""HF transformers `generate()` (PyTorch), generation only, on the benchmark workloads' model and
prompts: prompts x G sequences of 8 prompt tokens -> exactly max_new new tokens (min_new_tokens),
temperature-1 sampling without top-k/top-p, KV cache, fp32. CPU.

    .venv-trl/bin/python scripts/peers/hf_generate_bench.py --workload tiny --steps 11 --repeats 3

One iteration = one `generate` call on the whole batch (prompts x G = 64 sequences by default);
the first call of each run is excluded from the statistics.
"""

import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common_tiny as ct  # noqa: E402

args = ct.parse_args(__doc__.splitlines()[0], grpo=False, default_steps=11)

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

M = args.model
tok = ct.build_hf_tokenizer()
batch = args.prompts * args.group
# prompts x G: each prompt repeated G times, as in a GRPO rollout batch.
prompts = [p for p, _ in ct.make_problems(args.prompts, seed=1) for _ in range(args.group)]
enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
assert tuple(enc["input_ids"].shape) == (batch, ct.PROMPT_LEN), enc["input_ids"].shape


def make_model(seed):
  torch.manual_seed(seed)
  cfg = Qwen2Config(
    vocab_size=len(tok),
    hidden_size=M["hidden"],
    num_hidden_layers=M["layers"],
    num_attention_heads=M["heads"],
    num_key_value_heads=M["kv_heads"],
    head_dim=M["head_dim"],
    intermediate_size=M["mlp"],
    max_position_embeddings=max(256, ct.PROMPT_LEN + args.max_new + 8),
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    pad_token_id=tok.pad_token_id,
    eos_token_id=tok.eos_token_id,
    bos_token_id=None,
  )
  return Qwen2ForCausalLM(cfg).to(torch.float32).eval()


def gen(model):
  with torch.inference_mode():
    return model.generate(
      **enc,
      do_sample=True,
      temperature=ct.TEMPERATURE,
      top_k=0,
      top_p=1.0,
      max_new_tokens=args.max_new,
      min_new_tokens=None if args.allow_eos else args.max_new,
      use_cache=True,
      pad_token_id=tok.pad_token_id,
      eos_token_id=tok.eos_token_id,
    )


if __name__ == "__main__":
  print(
    f"torch {torch.__version__} transformers {transformers.__version__} "
    f"threads={torch.get_num_threads()} input_ids {tuple(enc['input_ids'].shape)} vocab={len(tok)}",
    flush=True,
  )
  runs = []
  for r in range(args.repeats):
    model = make_model(r)
    ts = []
    for _ in range(args.steps):
      t = time.perf_counter()
      out = gen(model)
      ts.append(time.perf_counter() - t)
      if not args.allow_eos:
        assert out.shape == (batch, ct.PROMPT_LEN + args.max_new), out.shape
    runs.append(ts)
    print(f"run {r}: call seconds {[round(x, 4) for x in ts]}", flush=True)
  res = dict(
    bench="hf_generate",
    peer="hf",
    **ct.workload_fields(args, grpo=False),
    versions=dict(torch=torch.__version__, transformers=transformers.__version__),
    threads=torch.get_num_threads(),
    **ct.summarize(runs),
  )
  res["tokens_per_s"] = batch * args.max_new / res["median_s"]
  ct.emit(res)
