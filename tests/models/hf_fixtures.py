"""Tiny random Hugging Face models (built with torch, test-only) saved to local folders.

Every parameter is drawn at random, norms and biases included (HF initialises norms to one and
biases to zero, which would hide a mapping error), at a scale that gives well-separated logits
so greedy decoding does not hinge on near ties.
"""

import copy
import dataclasses

import numpy as np

VOCAB = 100
COMMON = dict(
  vocab_size=VOCAB,
  hidden_size=32,
  intermediate_size=64,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
LLAMA3_ROPE = dict(
  rope_type="llama3",
  rope_theta=500000.0,
  factor=8.0,
  low_freq_factor=1.0,
  high_freq_factor=4.0,
  original_max_position_embeddings=32,
)


def _config(kind: str):
  import transformers

  if kind == "qwen2":  # q/k/v bias, tied embeddings
    return transformers.Qwen2Config(
      **COMMON, tie_word_embeddings=True, rope_theta=1e6, max_position_embeddings=128
    )
  if kind == "qwen3":  # head_dim 16 != hidden/heads = 8, untied
    return transformers.Qwen3Config(
      **COMMON, head_dim=16, tie_word_embeddings=False, rope_theta=1e6, max_position_embeddings=128
    )
  if kind == "llama3":  # Llama 3.1 RoPE scaling; positions beyond 32 exercise it
    return transformers.LlamaConfig(
      **{**COMMON, "hidden_size": 64},
      tie_word_embeddings=False,
      rope_parameters=dict(LLAMA3_ROPE),
      max_position_embeddings=512,
    )
  if kind == "llama_tied":
    return transformers.LlamaConfig(
      **COMMON, tie_word_embeddings=True, rope_theta=5e5, max_position_embeddings=128
    )
  if kind == "qwen3_moe":  # 4 experts, top-2, raw (unnormalised) top-k gates, head_dim 16
    return transformers.Qwen3MoeConfig(
      **COMMON,
      **MOE,
      head_dim=16,
      norm_topk_prob=False,
      tie_word_embeddings=False,
      rope_theta=1e6,
      max_position_embeddings=128,
    )
  if kind == "mixtral":  # renormalised top-k gates; experts are intermediate_size wide
    return transformers.MixtralConfig(
      **{**COMMON, "intermediate_size": 16},
      head_dim=16,
      num_local_experts=4,
      num_experts_per_tok=2,
      tie_word_embeddings=False,
      rope_theta=1e6,
      max_position_embeddings=128,
      sliding_window=None,
    )
  if kind == "qwen2_moe":  # shared expert with a sigmoid gate, q/k/v bias, tied
    return transformers.Qwen2MoeConfig(
      **COMMON,
      **MOE,
      norm_topk_prob=True,
      shared_expert_intermediate_size=24,
      tie_word_embeddings=True,
      rope_theta=1e6,
      max_position_embeddings=128,
    )
  raise ValueError(kind)


@dataclasses.dataclass
class HFCase:
  """A saved tiny model: its folder, the torch model (float32), test tokens and HF's logits."""

  kind: str
  path: str
  model: object
  tokens: np.ndarray
  logits: np.ndarray


def random_model(kind: str, *, seed: int = 0, bf16_values: bool = False):
  """A float32 torch causal LM of ``kind`` with every parameter random."""
  import torch
  import transformers

  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(_config(kind)).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.3 * torch.randn_like(p))
      else:
        p.copy_(0.2 * torch.randn_like(p))
      if bf16_values:
        p.copy_(p.to(torch.bfloat16).to(torch.float32))
  model.generation_config.eos_token_id = None
  model.generation_config.pad_token_id = 0
  return model


def hf_logits(model, tokens: np.ndarray) -> np.ndarray:
  import torch

  with torch.no_grad():
    return model(torch.from_numpy(np.asarray(tokens, np.int64))).logits.float().numpy()


def hf_greedy(model, prompts: np.ndarray, new_tokens: int) -> np.ndarray:
  """HF ``generate(do_sample=False)`` completions [B, new_tokens]."""
  import torch

  ids = torch.from_numpy(np.asarray(prompts, np.int64))
  with torch.no_grad():
    out = model.generate(
      ids,
      attention_mask=torch.ones_like(ids),
      do_sample=False,
      max_new_tokens=new_tokens,
      min_new_tokens=new_tokens,
    )
  return out[:, prompts.shape[1] :].numpy()


def build(
  kind: str,
  path: str,
  *,
  dtype: str = "float32",
  max_shard_size=None,
  seed: int = 0,
  batch: int = 2,
  length: int = 40,
) -> HFCase:
  """Saves a random ``kind`` model to ``path`` (bfloat16 tensors if ``dtype`` says so; shards
  when ``max_shard_size`` is given) and returns it with HF's float32 logits on random tokens."""
  import torch

  model = random_model(kind, seed=seed, bf16_values=dtype == "bfloat16")
  kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
  if dtype == "bfloat16":  # a copy: casting back would leave HF's RoPE buffer rounded
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(path, **kwargs)
  else:
    model.save_pretrained(path, **kwargs)
  tokens = np.random.default_rng(seed).integers(0, VOCAB, (batch, length)).astype(np.int32)
  return HFCase(kind, path, model, tokens, hf_logits(model, tokens))


def random_decoder(config, seed: int = 0):
  """Our Decoder of ``config`` with every parameter random (norms are ones and biases zeros at
  init, which would hide layout errors); built abstractly and filled from numpy, which is fast."""
  import jax.numpy as jnp
  from flax import nnx

  from posttrain_jax import models

  abstract = nnx.eval_shape(lambda: models.Decoder(config, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  rng = np.random.default_rng(seed)
  for path, var in nnx.to_flat_state(state):
    shape, dtype = var.get_value().shape, var.get_value().dtype
    base = 1.0 if "norm" in str(path[-1]) else 0.0
    var.set_value(jnp.asarray(base + 0.3 * rng.standard_normal(shape), dtype))
  return nnx.merge(graphdef, state)


def our_greedy(model, prompts: np.ndarray, new_tokens: int) -> np.ndarray:
  """Our jitted sampler at temperature 0 (no EOS stop): completions [B, new_tokens]."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from posttrain_jax import rollout

  graphdef, params = nnx.split(model)
  sample = rollout.make_sampler(
    graphdef, rollout.SamplerConfig(max_new_tokens=new_tokens, eos_id=-1, pad_id=0, temperature=0.0)
  )
  out = sample(params, jnp.asarray(prompts), jnp.ones(prompts.shape, jnp.int32), jax.random.key(0))
  return np.asarray(out.tokens[:, prompts.shape[1] :])
