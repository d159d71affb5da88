"""Shared pieces of the model tests: the architecture variants and a tiny model and batch."""

import jax
from flax import nnx

from posttrain_jax import models

VOCAB = 23
# The decoder options each equality test runs over (Llama, Qwen2's qkv bias, Qwen3's qk-norm).
VARIANTS = {
  "llama": dict(),
  "qwen2": dict(qkv_bias=True),
  "qwen3": dict(qk_norm=True, head_dim=24, tie_embeddings=False),
}


def nano_model(**kw) -> models.Decoder:
  return models.Decoder(models.preset("nano", vocab_size=VOCAB, **kw), rngs=nnx.Rngs(0))


def tokens(b: int, t: int, seed: int = 1) -> jax.Array:
  return jax.random.randint(jax.random.key(seed), (b, t), 3, VOCAB)
