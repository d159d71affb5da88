"""Loading Hugging Face checkpoints: logits and greedy generations equal transformers'."""

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("torch")

import hf_fixtures  # noqa: E402  (tests/models is on sys.path: rootdir-relative import)

from posttrain_jax import models  # noqa: E402
from posttrain_jax.models import (
  hf,  # noqa: E402
  hf_config,  # noqa: E402
  transformer,  # noqa: E402
)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
  cache = {}

  def get(kind, **kw):
    key = (kind, tuple(sorted(kw.items())))
    if key not in cache:
      cache[key] = hf_fixtures.build(kind, str(tmp_path_factory.mktemp(kind)), **kw)
    return cache[key]

  return get


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama3", "llama_tied"])
def test_logits_equal_transformers(case, kind):
  c = case(kind)
  model, config = hf.load_pretrained(c.path)
  hf_cfg = c.model.config
  assert config.tie_embeddings == hf_cfg.tie_word_embeddings
  head_dim = getattr(hf_cfg, "head_dim", None) or hf_cfg.hidden_size // 4
  assert config.head_dim == head_dim and config.num_kv_heads == 2
  assert config.head_dim == (16 if kind in ("qwen3", "llama3") else 8)
  assert (model.lm_head is None) == config.tie_embeddings
  logits = model(jnp.asarray(c.tokens)).logits
  assert logits.shape == c.logits.shape and logits.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(logits), c.logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama3"])
def test_greedy_generation_equals_transformers_generate(case, kind):
  c = case(kind)
  model, _ = hf.load_pretrained(c.path)
  prompts = c.tokens[:, :8]
  expected = hf_fixtures.hf_greedy(c.model, prompts, 16)
  np.testing.assert_array_equal(hf_fixtures.our_greedy(model, prompts, 16), expected)


def test_sharded_bf16_checkpoint(case):
  c = case("qwen3", dtype="bfloat16", max_shard_size="20KB")
  files = os.listdir(c.path)
  assert "model.safetensors.index.json" in files
  assert sum(f.endswith(".safetensors") for f in files) > 2
  model, config = hf.load_pretrained(c.path, dtype="float32")  # upcast: exact
  assert model.embed[...].dtype == jnp.float32
  np.testing.assert_allclose(
    np.asarray(model(jnp.asarray(c.tokens)).logits), c.logits, atol=1e-4, rtol=0
  )
  model, config = hf.load_pretrained(c.path)  # default: the checkpoint's dtype
  assert config.param_dtype == config.dtype == "bfloat16"
  assert model.layers.q[...].dtype == jnp.bfloat16
  np.testing.assert_allclose(
    np.asarray(model(jnp.asarray(c.tokens)).logits), c.logits, atol=0.3, rtol=0
  )


@pytest.mark.parametrize(
  "rope",
  [
    dict(
      rope_type="llama3",
      rope_theta=500000.0,
      factor=8.0,
      low_freq_factor=1.0,
      high_freq_factor=4.0,
      original_max_position_embeddings=8192,
    ),  # Llama 3.1
    dict(
      rope_type="llama3",
      rope_theta=500000.0,
      factor=32.0,
      low_freq_factor=1.0,
      high_freq_factor=4.0,
      original_max_position_embeddings=32,
    ),
    dict(rope_type="linear", rope_theta=10000.0, factor=4.0),
  ],
)
def test_rope_inv_freq_equals_transformers(rope):
  import transformers
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

  hf_cfg = transformers.LlamaConfig(
    hidden_size=512,
    num_attention_heads=4,
    max_position_embeddings=131072,
    rope_parameters=dict(rope),
  )
  expected, _ = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf_cfg, "cpu")
  config = hf_config.config_from_hf(hf_cfg.to_dict())
  assert config.rope_type == rope["rope_type"]
  np.testing.assert_allclose(
    np.asarray(transformer.rope_inv_freq(config)), expected.numpy(), rtol=1e-6
  )


def test_transformers_v4_config_keys():
  v4 = dict(
    model_type="llama",
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    rope_theta=500000.0,
    torch_dtype="bfloat16",
    rms_norm_eps=1e-5,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
    rope_scaling=dict(
      type="llama3",
      factor=8.0,
      low_freq_factor=1.0,
      high_freq_factor=4.0,
      original_max_position_embeddings=1024,
    ),
  )
  cfg = hf_config.config_from_hf(v4)
  assert (cfg.head_dim, cfg.num_kv_heads, cfg.rope_theta) == (16, 1, 500000.0)
  assert (cfg.rope_type, cfg.rope_factor, cfg.rope_original_max_len) == ("llama3", 8.0, 1024)
  assert cfg.param_dtype == "bfloat16" and cfg.rms_norm_eps == 1e-5 and cfg.tie_embeddings
  assert cfg.max_seq_len == 4096 and not cfg.qkv_bias and not cfg.qk_norm
  assert hf_config.config_from_hf(v4, dtype=jnp.float32).param_dtype == "float32"
  qwen2 = dict(v4, model_type="qwen2", rope_scaling=None, rope_theta=1e6, head_dim=32)
  cfg = hf_config.config_from_hf(qwen2)
  assert cfg.qkv_bias and cfg.rope_type == "default" and cfg.head_dim == 32
  assert cfg.rope_theta == 1e6


# -- errors -------------------------------------------------------------------------------------
def _copy(c, tmp_path):
  dst = str(tmp_path / "copy")
  shutil.copytree(c.path, dst)
  return dst


def _edit_config(path, **changes):
  file = os.path.join(path, "config.json")
  with open(file) as f:
    cfg = json.load(f)
  cfg.update(changes)
  with open(file, "w") as f:
    json.dump(cfg, f)


def test_missing_folder_and_config(tmp_path):
  with pytest.raises(FileNotFoundError, match="no Hugging Face model folder"):
    hf.load_pretrained(str(tmp_path / "nope"))
  with pytest.raises(FileNotFoundError, match="no config.json"):
    hf.load_pretrained(str(tmp_path))


def test_unsupported_model_type(case, tmp_path):
  path = _copy(case("qwen2"), tmp_path)
  _edit_config(path, model_type="gpt2")
  with pytest.raises(ValueError, match="unsupported model_type 'gpt2'.*llama, qwen2, qwen3"):
    hf.load_pretrained(path)
  _edit_config(path, model_type="qwen2", use_sliding_window=True)
  with pytest.raises(ValueError, match="sliding"):
    hf.load_pretrained(path)


def test_missing_weight_wrong_shape_extra_weight(case, tmp_path):
  from safetensors.numpy import load_file, save_file

  path = _copy(case("qwen2"), tmp_path)
  file = os.path.join(path, "model.safetensors")
  tensors = load_file(file)
  name = "model.layers.1.self_attn.k_proj.bias"
  save_file({k: v for k, v in tensors.items() if k != name}, file, metadata={"format": "pt"})
  with pytest.raises(hf.HFError, match=f"weight '{name}' not found"):
    hf.load_pretrained(path)
  save_file(
    {**tensors, "model.layers.0.self_attn.o_proj.bias": np.zeros(32, np.float32)},
    file,
    metadata={"format": "pt"},
  )
  with pytest.raises(hf.HFError, match="does not use: model.layers.0.self_attn.o_proj.bias"):
    hf.load_pretrained(path)
  save_file(tensors, file, metadata={"format": "pt"})
  _edit_config(path, intermediate_size=48)
  with pytest.raises(
    hf.HFError,
    match=r"mlp.gate_proj.weight'.*shape \[64, 32\], expected "
    r"\[48, 32\]",
  ):
    hf.load_pretrained(path)
  os.remove(file)
  with pytest.raises(FileNotFoundError, match="model.safetensors"):
    hf.load_pretrained(path)


def test_tokenizer_with_chat_template(tmp_path):
  tok = models.build_char_tokenizer("abc xyz:")
  tok.chat_template = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
  )
  tok.save_pretrained(str(tmp_path))
  loaded = hf.load_hf_tokenizer(str(tmp_path))
  text = loaded.apply_chat_template(
    [{"role": "user", "content": "abc"}], tokenize=False, add_generation_prompt=True
  )
  assert text == "user: abc\nassistant: "
  with pytest.raises(FileNotFoundError, match="no tokenizer files"):
    (tmp_path / "empty").mkdir()
    hf.load_hf_tokenizer(str(tmp_path / "empty"))
