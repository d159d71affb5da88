"""Character-level tokenizers built locally, saved and loaded as Hugging Face tokenizer folders.

The tasks' tokenizer is a ``tokenizers`` WordLevel model over single characters, wrapped in a
``transformers.PreTrainedTokenizerFast`` so it is saved and loaded exactly like a real model's
tokenizer (``AutoTokenizer.from_pretrained(path)``): one loading path serves both.
"""

import json
import os
import shutil

import tokenizers
import transformers
from tokenizers import decoders, models, pre_tokenizers

from posttrain_jax.models.hf_config import HFError

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"


def build_char_tokenizer(chars: str) -> transformers.PreTrainedTokenizerFast:
  """A tokenizer with ids 0,1,2 = <pad>,<eos>,<unk>, then one id per distinct character."""
  ordered = sorted(set(chars))
  vocab = {PAD: 0, EOS: 1, UNK: 2}
  for ch in ordered:
    vocab[ch] = len(vocab)
  tok = tokenizers.Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
  tok.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex(r"[\s\S]"), behavior="isolated")
  tok.decoder = decoders.Fuse()
  return transformers.PreTrainedTokenizerFast(
    tokenizer_object=tok,
    pad_token=PAD,
    eos_token=EOS,
    unk_token=UNK,
    padding_side="left",
    clean_up_tokenization_spaces=False,
  )


def save_tokenizer(tokenizer, path: str) -> None:
  """Saves ``tokenizer`` as the folder ``path``, atomically: into a temporary sibling folder,
  renamed to ``path`` once complete (a kill leaves no folder, or the old one, never a partial
  one). A folder already at ``path`` is replaced."""
  tmp, old = f"{path}.tmp-{os.getpid()}", f"{path}.old-{os.getpid()}"
  shutil.rmtree(tmp, ignore_errors=True)
  tokenizer.save_pretrained(tmp)
  if os.path.lexists(path):
    os.replace(path, old)
  os.replace(tmp, path)
  shutil.rmtree(old, ignore_errors=True)


class DamagedTokenizerError(HFError):
  """A tokenizer folder exists but cannot be loaded (empty, truncated, not a tokenizer);
  ``reason`` is the message without the advice (a caller that repairs it gives its own)."""

  def __init__(self, reason: str, advice: str):
    super().__init__(f"{reason}: {advice}")
    self.reason = reason


# tokenizer_config.json classes that are a plain tokenizers-backed tokenizer (ours; transformers
# 5 calls PreTrainedTokenizerFast "TokenizersBackend").
_PLAIN_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")


def load_tokenizer(path: str):
  """Loads any Hugging Face tokenizer folder (ours or a real model's), offline.

  A plain tokenizers-backed folder (ours) loads through ``PreTrainedTokenizerFast`` directly:
  ``AutoTokenizer`` first resolves the model config, which imports torch when it is installed
  (~2 s of every run's start-up, for the same tokenizer)."""
  if not os.path.isdir(path):
    raise FileNotFoundError(f"no tokenizer folder at {path!r}")
  try:
    with open(os.path.join(path, "tokenizer_config.json"), encoding="utf-8") as f:
      tokenizer_class = json.load(f).get("tokenizer_class")
  except (OSError, ValueError):
    tokenizer_class = None
  try:
    if tokenizer_class in _PLAIN_CLASSES and os.path.isfile(os.path.join(path, "tokenizer.json")):
      return transformers.PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
  except Exception as e:  # pylint: disable=broad-except  (transformers raises many kinds)
    files = sorted(os.listdir(path))
    first = (str(e).strip().splitlines() or [""])[0][:160]
    why = f"{type(e).__name__}: {first}; files: {', '.join(files)}" if files else "it is empty"
    raise DamagedTokenizerError(
      f"the tokenizer folder {path} cannot be loaded ({why})",
      "it is incomplete, e.g. a kill while it was written; move it away and rerun the stage "
      "that wrote it",
    ) from e
