"""Character-level tokenizers built locally, saved and loaded as Hugging Face tokenizer folders.

The tasks' tokenizer is a ``tokenizers`` WordLevel model over single characters, wrapped in a
``transformers.PreTrainedTokenizerFast`` so it is saved and loaded exactly like a real model's
tokenizer (``AutoTokenizer.from_pretrained(path)``): one loading path serves both.
"""

import os

import tokenizers
import transformers
from tokenizers import decoders, models, pre_tokenizers

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
      tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK,
      padding_side="left", clean_up_tokenization_spaces=False)


def save_tokenizer(tokenizer, path: str) -> None:
  os.makedirs(path, exist_ok=True)
  tokenizer.save_pretrained(path)


def load_tokenizer(path: str):
  """Loads any Hugging Face tokenizer folder (ours or a real model's), offline."""
  if not os.path.isdir(path):
    raise FileNotFoundError(f"no tokenizer folder at {path!r}")
  return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
