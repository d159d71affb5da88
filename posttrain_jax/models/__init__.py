"""Decoder LMs (flax nnx, dense or mixture of experts), KV cache, presets, tokenizers and Hugging
Face interop."""

from posttrain_jax.models import hf, moe
from posttrain_jax.models.config import PRESETS, ModelConfig, preset
from posttrain_jax.models.decode_cache import KVCache, init_cache
from posttrain_jax.models.grouped import grouped_forward
from posttrain_jax.models.hf import load_hf_tokenizer, load_pretrained, save_pretrained
from posttrain_jax.models.init import TRUNK, init_decoder, with_head
from posttrain_jax.models.ops import gather_logprobs
from posttrain_jax.models.tokenizer import (
  DamagedTokenizerError,
  build_char_tokenizer,
  load_tokenizer,
  save_tokenizer,
)
from posttrain_jax.models.transformer import Decoder, LMOutput

__all__ = [
  "PRESETS",
  "Decoder",
  "KVCache",
  "LMOutput",
  "ModelConfig",
  "DamagedTokenizerError",
  "build_char_tokenizer",
  "gather_logprobs",
  "grouped_forward",
  "hf",
  "init_cache",
  "init_decoder",
  "with_head",
  "TRUNK",
  "load_hf_tokenizer",
  "load_pretrained",
  "load_tokenizer",
  "moe",
  "preset",
  "save_pretrained",
  "save_tokenizer",
]
