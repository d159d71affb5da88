"""Decoder LMs (flax nnx), KV cache, presets and tokenizers."""

from posttrain_jax.models.config import PRESETS, ModelConfig, preset
from posttrain_jax.models.tokenizer import build_char_tokenizer, load_tokenizer, save_tokenizer
from posttrain_jax.models.transformer import (Decoder, KVCache, LMOutput, gather_logprobs,
                                              init_cache)

__all__ = ["PRESETS", "Decoder", "KVCache", "LMOutput", "ModelConfig", "build_char_tokenizer",
           "gather_logprobs", "init_cache", "load_tokenizer", "preset", "save_tokenizer"]
