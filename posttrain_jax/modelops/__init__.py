"""Weight-space operators on a decoder's parameter tree (LoRA adapters, merging)."""

from posttrain_jax.modelops import lora, merge
from posttrain_jax.modelops.lora import LoraConfig

# name -> operator(trees, **kwargs) -> tree: what a `modelop` stage applies to the final
# parameters of the stages it lists (config.stage_specs.NAME: op, inputs, kwargs).
MODEL_OPS = {
  "average": merge.average,
}

__all__ = ["MODEL_OPS", "LoraConfig", "lora", "merge"]
