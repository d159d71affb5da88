from posttrain_jax import envs, models


def test_round_trip_through_hf_folder(tmp_path):
  tok = models.build_char_tokenizer(envs.CHARSET)
  models.save_tokenizer(tok, str(tmp_path / "tok"))
  loaded = models.load_tokenizer(str(tmp_path / "tok"))
  assert len(loaded) == len(tok) == 3 + len(envs.CHARSET)
  assert (loaded.pad_token_id, loaded.eos_token_id) == (0, 1)
  text = "12 7 3>25:(12-7)*3+10"
  ids = loaded(text, add_special_tokens=False)["input_ids"]
  assert len(ids) == len(text)  # one token per character, spaces included
  assert loaded.decode(ids + [loaded.eos_token_id, 0, 0], skip_special_tokens=True) == text
  assert loaded.padding_side == "left"


def test_missing_folder(tmp_path):
  import pytest

  with pytest.raises(FileNotFoundError, match="no tokenizer"):
    models.load_tokenizer(str(tmp_path / "absent"))


def test_our_folder_loads_without_auto_tokenizer_and_equals_it(tmp_path):
  """Our plain tokenizers-backed folders skip AutoTokenizer (which imports torch when it is
  installed) and load as the very same tokenizer."""
  import os
  import subprocess
  import sys

  import transformers

  path = str(tmp_path / "tok")
  models.save_tokenizer(models.build_char_tokenizer(envs.CORE_CHARSET), path)
  ours = models.load_tokenizer(path)
  auto = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
  assert type(ours) is type(auto) and ours.get_vocab() == auto.get_vocab()
  assert (ours.pad_token_id, ours.eos_token_id, ours.padding_side) == (
    auto.pad_token_id,
    auto.eos_token_id,
    auto.padding_side,
  )
  text = "12+34=46"
  assert (
    ours(text, add_special_tokens=False)["input_ids"]
    == auto(text, add_special_tokens=False)["input_ids"]
  )
  code = (
    "import sys\nfrom posttrain_jax.models import tokenizer\n"
    f"tokenizer.load_tokenizer({path!r})\nprint('torch' in sys.modules)"
  )
  out = subprocess.run(
    [sys.executable, "-c", code],
    capture_output=True,
    text=True,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.split()[-1] == "False"
