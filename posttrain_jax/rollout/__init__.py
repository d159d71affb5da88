"""Generation: the Rollout pytree, the jitted prefill + while_loop sampler and its multi-turn form
(and its bucket scheduler)."""

from posttrain_jax.rollout.buckets import Bucket, BucketScheduler
from posttrain_jax.rollout.multi_turn import TurnConfig, make_multi_turn_sampler
from posttrain_jax.rollout.precision import PRECISIONS, make_inference_cast
from posttrain_jax.rollout.sampler import (
  DecodeState,
  SamplerConfig,
  filter_logits,
  make_sampler,
  sample_token,
)
from posttrain_jax.rollout.text import continuation_only, decode_completions, encode_prompts
from posttrain_jax.rollout.types import (
  Rollout,
  bucket_length,
  left_pad,
  trim_completions,
  trimmed_length,
)
from posttrain_jax.rollout.weights import InferenceWeights

__all__ = [
  "PRECISIONS",
  "Bucket",
  "BucketScheduler",
  "DecodeState",
  "InferenceWeights",
  "Rollout",
  "SamplerConfig",
  "TurnConfig",
  "bucket_length",
  "continuation_only",
  "decode_completions",
  "encode_prompts",
  "filter_logits",
  "left_pad",
  "make_inference_cast",
  "make_multi_turn_sampler",
  "make_sampler",
  "sample_token",
  "trim_completions",
  "trimmed_length",
]
