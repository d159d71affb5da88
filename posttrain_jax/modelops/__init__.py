"""Weight-space operators on a decoder's parameter tree (LoRA adapters, merging, base-anchored
fusion, sparse rollback, neuron reset)."""

from posttrain_jax.modelops import anchored, lora, merge, neurons
from posttrain_jax.modelops.lora import LoraConfig

# name -> operator(trees, **kwargs) -> tree: what a `modelop` stage applies to the final
# parameters of the stages it lists (config.stage_specs.NAME: op, inputs, kwargs).
MODEL_OPS = {
  "average": merge.average,
  "fuse": anchored.fuse,
  "rollback": anchored.rollback,
  "reset_neurons": neurons.reset_neurons,
}

__all__ = ["MODEL_OPS", "LoraConfig", "anchored", "lora", "merge", "neurons"]
