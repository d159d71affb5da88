"""CME with a verifier LM of another vocabulary: the batched reward term ``cme_text``.

CME (arXiv 2605.29009; methods_B.md section 14) rewards a completion by its mean log-likelihood
under a separate frozen verifier LM::

    r(x, y) = (1/|y|) sum_t log p_V(y_t | x, y_<t)          (on the verifier's tokens; r <= 0)

When the verifier shares the policy's tokenizer, the RL step already has those log-probs (the
configured teacher's): use the shaping term ``cme`` (``objectives.shaping.cme``). This term is
for a verifier with its own tokenizer (a Hugging Face folder): the texts are re-tokenised with
the verifier's tokenizer, the prompt's ids then the completion's then the verifier's EOS (so the
end of the text is scored too and no completion is empty), and ``y`` is the completion's ids
plus that EOS. Scored on device in row and length buckets (a run compiles a handful of shapes),
no gradient (it runs outside the training step).
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posttrain_jax import models, rollout
from posttrain_jax.objectives import shaping
from posttrain_jax.registry import ConfigError
from posttrain_jax.rewards.catalogue import REWARDS, RunInfo, batched

MIN_ROWS = 8
MAX_ROWS = 128


def completion_mask(prompt_lengths: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
  """[B, width] float32: 1 at the positions of the completion's tokens (``prompt_length`` to
  ``length - 1``), whose log-probs are read from the logits one position earlier."""
  pos = np.arange(width)[None, :]
  return ((pos >= prompt_lengths[:, None]) & (pos < lengths[:, None])).astype(np.float32)


def mean_logprobs(graphdef, params, tokens: jax.Array, mask: jax.Array) -> jax.Array:
  """[B] mean log-prob of the tokens where ``mask`` [B, T] (each predicted from the logits of
  the position before it) under the model; traceable."""
  logits = nnx.merge(graphdef, params)(tokens).logits.astype(jnp.float32)
  logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
  token_logp = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
  return shaping.mean_token_logprob(token_logp, mask[:, 1:])


@dataclasses.dataclass
class Verifier:
  """A loaded verifier LM: ``graphdef``/``params`` (a Decoder), its ``tokenizer`` and the
  longest sequence it scores (``max_len``: longer ones keep their last ``max_len`` tokens)."""

  graphdef: Any
  params: Any
  tokenizer: Any
  max_len: int
  fn: Any = None

  def __post_init__(self):
    if self.fn is None:
      self.fn = jax.jit(lambda p, t, m: mean_logprobs(self.graphdef, p, t, m))

  def encode(self, prompts, completions) -> tuple[list[list[int]], list[int]]:
    """Per pair, ``prompt ids + completion ids + EOS`` and the prompt's length (cut from the
    left to ``max_len``, keeping at least the completion's last tokens)."""
    tok = self.tokenizer
    p_ids = tok(list(prompts), add_special_tokens=False)["input_ids"] if prompts else []
    c_ids = tok(list(completions), add_special_tokens=False)["input_ids"] if completions else []
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    rows, starts = [], []
    for p, c in zip(p_ids, c_ids):
      row, start = list(p) + list(c) + eos, len(p)
      cut = max(0, len(row) - self.max_len)
      rows.append(row[cut:])
      starts.append(max(start - cut, 1))  # the first token has no prediction
    return rows, starts

  def score(self, prompts, completions) -> np.ndarray:
    """[N] float32 mean log-likelihoods of the completions after their prompts."""
    rows, starts = self.encode(prompts, completions)
    out = np.zeros((len(rows),), np.float32)
    pad_id = self.tokenizer.pad_token_id or 0
    for lo in range(0, len(rows), MAX_ROWS):
      chunk, first = rows[lo : lo + MAX_ROWS], np.asarray(starts[lo : lo + MAX_ROWS])
      width = rollout.bucket_length(max(len(r) for r in chunk))
      n = rollout.bucket_length(len(chunk), MIN_ROWS)
      tokens = np.full((n, width), pad_id, np.int32)
      lengths = np.zeros((n,), np.int64)
      for i, r in enumerate(chunk):
        tokens[i, : len(r)], lengths[i] = r, len(r)
      starts_all = np.concatenate([first, np.zeros(n - len(chunk), np.int64)])
      mask = completion_mask(starts_all, lengths, width)
      out[lo : lo + len(chunk)] = np.asarray(self.fn(self.params, tokens, mask))[: len(chunk)]
    return out


def load(path: str, max_len: int = 0) -> Verifier:
  """The verifier LM of a Hugging Face folder (weights and tokenizer), on one device."""
  try:
    model, config = models.hf.load_pretrained(path)
    tokenizer = models.load_hf_tokenizer(path)
  except (OSError, ValueError) as e:
    raise ConfigError(
      f"the reward term 'cme_text' cannot load a verifier LM from {path!r} "
      f"({type(e).__name__}: {e}); give kwargs path=<a Hugging Face folder with "
      "config.json, safetensors weights and a tokenizer>"
    ) from None
  graphdef, params = nnx.split(model)
  return Verifier(graphdef, params, tokenizer, max_len or config.max_seq_len)


@batched
def cme_text(problems, completions, *, run: RunInfo, path: str = "", max_len: int = 0):
  """The batched term ``cme_text``: ``[N]`` mean log-likelihoods of each completion after its
  problem's prompt under the verifier LM in the Hugging Face folder ``path`` (its own
  tokenizer; loaded once per run, kept in ``run.cache``)."""
  if not path:
    raise ConfigError(
      "the reward term 'cme_text' needs kwargs path=<a Hugging Face folder>; "
      "for a verifier with the run's own tokenizer use the shaping term 'cme' "
      "(config.rl.reward_shaping) with config.rl.teacher"
    )
  key = ("cme_text", path, max_len)
  verifier = run.cache.get(key)
  if verifier is None:
    verifier = run.cache[key] = load(path, max_len)
  return verifier.score([p.prompt for p in problems], list(completions))


REWARDS["cme_text"] = cme_text
