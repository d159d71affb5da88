"""The Rollout pytree (DESIGN.md section 2) and host-side prompt padding."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


@struct.dataclass
class Rollout:
  """A batch of ``B`` generated sequences: left-padded prompt (``S``) then completion (``T``).

  Attributes:
    tokens: [B, S+T] int32, prompt then completion; pad after EOS.
    prompt_mask: [B, S] float32, 1 on real prompt tokens (left padding is 0).
    completion_mask: [B, T] float32, 1 on generated tokens up to and including EOS.
    logprobs: [B, T] float32 behaviour log-probs of the sampled tokens (0 where masked).
    lengths: [B] int32 completion lengths (sum of completion_mask).
    truncated: [B] bool, True when no EOS was produced within T tokens.
    group: [B] int32 prompt index of each sequence.
    policy_version: [B] int32 version of the weights that produced it.
    routes: mixture-of-experts rollouts recorded with ``SamplerConfig.record_routing``:
      [B, L, S+T, k] int32, the experts every position of ``tokens`` was routed to in each
      layer (rows first like every field; -1 where no token was fed, e.g. the last
      position); None otherwise. ``jnp.swapaxes(routes, 0, 1)[:, :, :-1]`` is the ``routing``
      a trainer's ``model(tokens[:, :-1], routing=...)`` replays.
  """
  tokens: jax.Array
  prompt_mask: jax.Array
  completion_mask: jax.Array
  logprobs: jax.Array
  lengths: jax.Array
  truncated: jax.Array
  group: jax.Array
  policy_version: jax.Array
  routes: jax.Array | None = None

  @property
  def prompt_len(self) -> int:
    return self.prompt_mask.shape[1]

  @property
  def start(self) -> jax.Array:
    """[B] int32 first real position of each row."""
    return (self.prompt_len - jnp.sum(self.prompt_mask, axis=1)).astype(jnp.int32)

  @property
  def completion(self) -> jax.Array:
    """[B, T] int32 completion tokens."""
    return self.tokens[:, self.prompt_len:]


def bucket_length(n: int, minimum: int = 8) -> int:
  """The smallest power of two >= max(n, minimum): a run compiles a handful of shapes."""
  length = minimum
  while length < n:
    length *= 2
  return length


def left_pad(ids: list[list[int]], pad_id: int, *, bucket: bool = True,
             length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Left-pads token-id lists into ``([N, S] int32 tokens, [N, S] float32 mask)``."""
  longest = max((len(x) for x in ids), default=1)
  if length is None:
    length = bucket_length(longest) if bucket else longest
  if longest > length:
    raise ValueError(f"prompt of {longest} tokens does not fit the length {length}")
  tokens = np.full((len(ids), length), pad_id, np.int32)
  mask = np.zeros((len(ids), length), np.float32)
  for i, x in enumerate(ids):
    if x:
      tokens[i, length - len(x):] = x
      mask[i, length - len(x):] = 1.0
  return tokens, mask
