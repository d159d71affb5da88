"""Exporting to Hugging Face folders: transformers loads them and computes the same logits."""

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

pytest.importorskip("torch")

import hf_fixtures  # noqa: E402

from posttrain_jax import io as ptio  # noqa: E402
from posttrain_jax import models  # noqa: E402
from posttrain_jax.models import hf  # noqa: E402
from posttrain_jax.train import export_hf

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _auto(path):
  import transformers

  return transformers.AutoModelForCausalLM.from_pretrained(path).eval()


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama3"])
def test_hf_roundtrip_through_our_model(kind, tmp_path):
  c = hf_fixtures.build(kind, str(tmp_path / "src"))
  model, config = hf.load_pretrained(c.path)
  out = str(tmp_path / "out")
  hf.save_pretrained(model, config, out, max_shard_size="30KB")
  assert os.path.isfile(os.path.join(out, "model.safetensors.index.json"))
  back = _auto(out)
  assert type(back) is type(c.model)
  np.testing.assert_allclose(hf_fixtures.hf_logits(back, c.tokens), c.logits, atol=1e-5, rtol=0)
  reloaded, config2 = hf.load_pretrained(out)
  assert config2 == config
  for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(reloaded))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize(
  "variant",
  [
    dict(qk_norm=True, head_dim=24, tie_embeddings=False),  # qwen3
    dict(qkv_bias=True, rope_theta=1e6),  # qwen2, tied
    dict(
      rope_type="llama3",
      rope_factor=4.0,
      rope_original_max_len=16,  # llama 3.1
      rope_theta=5e5,
      tie_embeddings=False,
    ),
  ],
)
def test_native_decoder_exports(variant, tmp_path):
  config = models.preset("nano", vocab_size=50, max_seq_len=128, **variant)
  model = hf_fixtures.random_decoder(config)
  tokens = np.random.default_rng(0).integers(0, 50, (2, 30)).astype(np.int32)
  ours = np.asarray(model(jnp.asarray(tokens)).logits)
  hf.save_pretrained(nnx.state(model, nnx.Param), config, str(tmp_path))
  np.testing.assert_allclose(
    hf_fixtures.hf_logits(_auto(str(tmp_path)), tokens), ours, atol=1e-4, rtol=0
  )


def test_bfloat16_export_and_model_type_check(tmp_path):
  config = models.preset("nano", vocab_size=50, qk_norm=True)
  model = hf_fixtures.random_decoder(config)
  hf.save_pretrained(model, config, str(tmp_path), dtype="bfloat16", model_type="qwen3")
  with open(tmp_path / "config.json") as f:
    assert json.load(f)["dtype"] == "bfloat16"
  back, back_config = hf.load_pretrained(str(tmp_path), dtype="float32")
  assert back_config.qk_norm
  want = jax.tree.leaves(nnx.state(model))
  for a, b in zip(want, jax.tree.leaves(nnx.state(back))):
    np.testing.assert_array_equal(
      np.asarray(a.astype(jnp.bfloat16).astype(jnp.float32)), np.asarray(b)
    )
  with pytest.raises(hf.HFError, match="is a 'qwen3' model, not 'llama'"):
    hf.save_pretrained(model, config, str(tmp_path), model_type="llama")
  with pytest.raises(hf.HFError, match="output_dim"):
    hf.save_pretrained(model, models.preset("nano", vocab_size=50, output_dim=1), str(tmp_path))


# -- scripts/export_hf.py ----------------------------------------------------------------------
def _script():
  return export_hf


def _fake_run(workdir) -> tuple[models.Decoder, object]:
  """A run folder as ``posttrain_jax.main`` leaves it: config.json, tokenizer, rl/final."""
  from posttrain_jax.train import state as state_lib

  tok_dir = os.path.join(workdir, "tokenizer")
  models.save_tokenizer(models.build_char_tokenizer("0123456789+=: "), tok_dir)
  tokenizer = models.load_tokenizer(tok_dir)
  model_cfg = dict(preset="nano", dtype="float32", max_seq_len=64, overrides={})
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump(dict(model=model_cfg, stages=["pretrain", "rl", "eval"], seed=0), f)
  graphdef, params = state_lib.build_model(ml_collections.ConfigDict(model_cfg), len(tokenizer), 7)
  model = hf_fixtures.random_decoder(nnx.merge(graphdef, params).config, seed=7)
  ckpt = ptio.Checkpointer(os.path.join(workdir, "rl", "final"), max_to_keep=1)
  ckpt.save(0, nnx.state(model), {"stage": "rl"})
  ckpt.close()
  return model, tokenizer


def test_export_script_on_a_run_and_an_hf_folder(tmp_path, capsys):
  import transformers

  script = _script()
  run = str(tmp_path / "run")
  model, tokenizer = _fake_run(run)
  out = str(tmp_path / "out")
  assert script.main([run, out]) == 0
  assert "stage 'rl'" in capsys.readouterr().out
  hf_tok = transformers.AutoTokenizer.from_pretrained(out)
  ids = np.asarray([hf_tok("12+34=")["input_ids"]], np.int32)
  np.testing.assert_array_equal(ids[0], tokenizer("12+34=")["input_ids"])
  np.testing.assert_allclose(
    hf_fixtures.hf_logits(_auto(out), ids),
    np.asarray(model(jnp.asarray(ids)).logits),
    atol=1e-4,
    rtol=0,
  )
  with open(os.path.join(out, "config.json")) as f:
    assert json.load(f)["eos_token_id"] == tokenizer.eos_token_id
  # An HF folder round trip (with its tokenizer), then bfloat16.
  again = str(tmp_path / "again")
  assert script.main([out, again, "--dtype=bfloat16", "--max_shard_size=20KB"]) == 0
  assert os.path.isfile(os.path.join(again, "model.safetensors.index.json"))
  assert os.path.isfile(os.path.join(again, "tokenizer.json"))


@pytest.mark.parametrize(
  "args, message",
  [
    (["{tmp}/missing", "{tmp}/out"], "no such folder"),
    (["{tmp}/run", "{tmp}/out", "--stage=sft"], "no final parameters for stage 'sft'"),
    (["{tmp}/empty", "{tmp}/out"], "has no config.json"),
  ],
)
def test_export_script_errors_are_one_line(args, message, tmp_path, capsys):
  os.makedirs(tmp_path / "run" / "pretrain")
  os.makedirs(tmp_path / "empty")
  with open(tmp_path / "run" / "config.json", "w") as f:
    json.dump(dict(model=dict(preset="nano"), stages=["pretrain", "rl"]), f)
  assert _script().main([a.format(tmp=tmp_path) for a in args]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and message in err and "\n" not in err
