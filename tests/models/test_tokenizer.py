from posttrain_jax import envs
from posttrain_jax import models


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
