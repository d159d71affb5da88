"""Host-side text <-> token conversion around the jitted sampler (tokenization stays out of jit)."""

import numpy as np

from posttrain_jax.rollout.types import left_pad


def encode_prompts(tokenizer, prompts: list[str], *, length: int | None = None):
  """Left-padded ``([N, S] int32, [N, S] float32)`` token ids and mask for ``prompts``."""
  ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
  return left_pad(ids, tokenizer.pad_token_id, length=length)


def decode_completions(tokenizer, completion: np.ndarray) -> list[str]:
  """Completion texts of ``[B, T]`` ids; EOS and padding are dropped."""
  return tokenizer.batch_decode(np.asarray(completion), skip_special_tokens=True)


def continuation_only(completion: np.ndarray, lengths: np.ndarray, pad_id: int) -> np.ndarray:
  """``completion`` [R, T] with each row's first ``lengths[r]`` tokens (its prefix) padded out:
  the text the reward reads (a prefix given to the sampler, e.g. DenoiseRL's, never scores)."""
  positions = np.arange(completion.shape[1])[None, :]
  return np.where(positions < np.asarray(lengths)[:, None], pad_id, completion)
