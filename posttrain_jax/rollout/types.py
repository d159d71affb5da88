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
    env_mask: multi-turn rollouts (rollout.multi_turn): [B, T] float32, 1 on the completion
      tokens the host inserted (tool observations, a given prefix), which ``completion_mask``
      leaves out: they are in ``tokens`` (the model reads them) but are not the model's own,
      get no loss and no behaviour log-prob; None for single-turn rollouts.
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
  env_mask: jax.Array | None = None

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
    return self.tokens[:, self.prompt_len :]


def bucket_length(n: int, minimum: int = 8) -> int:
  """The smallest power of two >= max(n, minimum): a run compiles a handful of shapes."""
  length = minimum
  while length < n:
    length *= 2
  return length


def trimmed_length(completion_mask, minimum: int) -> int:
  """The completion width a batch needs: the :func:`bucket_length` (at least ``minimum``) of
  one past its last unmasked position, capped at the padded width ``T``.

  ``completion_mask`` [B, T] (numpy or an array; read on the host). The bucketing keeps the
  number of distinct widths, hence of compiled trainer programs, to a handful per run."""
  mask = np.asarray(completion_mask)
  T = mask.shape[1]
  on = np.flatnonzero(np.any(mask > 0, axis=0))
  needed = int(on[-1]) + 1 if on.size else 1
  return min(T, bucket_length(needed, minimum))


def trim_completions(ro: Rollout, length: int) -> Rollout:
  """``ro`` with the completion axis cut to its first ``length`` positions (tokens, mask,
  log-probs and recorded routes); unchanged if ``length`` >= T.

  Exact for everything computed under the completion mask when no unmasked position is cut
  (:func:`trimmed_length` picks such a width): a causal model's outputs at the kept positions
  do not depend on the cut ones."""
  T = ro.completion_mask.shape[1]
  if length >= T:
    return ro
  if length < 1:
    raise ValueError(f"trim_completions: length must be >= 1, got {length}")
  end = ro.prompt_len + length
  routes = None if ro.routes is None else ro.routes[:, :, :end]
  env_mask = None if ro.env_mask is None else ro.env_mask[:, :length]
  return ro.replace(
    tokens=ro.tokens[:, :end],
    completion_mask=ro.completion_mask[:, :length],
    logprobs=ro.logprobs[:, :length],
    routes=routes,
    env_mask=env_mask,
  )


def left_pad(
  ids: list[list[int]], pad_id: int, *, bucket: bool = True, length: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
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
      tokens[i, length - len(x) :] = x
      mask[i, length - len(x) :] = 1.0
  return tokens, mask
