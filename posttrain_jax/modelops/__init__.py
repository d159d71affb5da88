"""Weight-space operators on a decoder's parameter tree (LoRA adapters, merging)."""

from posttrain_jax.modelops import lora
from posttrain_jax.modelops.lora import LoraConfig

__all__ = ["LoraConfig", "lora"]
