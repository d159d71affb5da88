"""Hugging Face mixtures of experts (qwen3_moe, mixtral, qwen2_moe): logits, load-balancing loss,
greedy generation and export equal transformers'."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

pytest.importorskip("torch")

import hf_fixtures  # noqa: E402  (tests/models is on sys.path: rootdir-relative import)

from posttrain_jax import models  # noqa: E402
from posttrain_jax.models import (
  hf,  # noqa: E402
  hf_config,  # noqa: E402
)

KINDS = ["qwen3_moe", "mixtral", "qwen2_moe"]


@pytest.fixture(scope="module")
def case(tmp_path_factory):
  cache = {}

  def get(kind):
    if kind not in cache:
      c = hf_fixtures.build(kind, str(tmp_path_factory.mktemp(kind)))
      model, config = hf.load_pretrained(c.path)
      cache[kind] = (c, model, config)
    return cache[kind]

  return get


def _hf_forward(model, tokens, **kw):
  import torch

  with torch.no_grad():
    return model(
      torch.from_numpy(np.asarray(tokens, np.int64)),
      output_router_logits=True,
      **{k: torch.from_numpy(np.asarray(v, np.int64)) for k, v in kw.items()},
    )


@pytest.mark.parametrize("kind", KINDS)
def test_logits_and_aux_loss_equal_transformers(case, kind):
  c, model, config = case(kind)
  hf_cfg = c.model.config
  assert config.num_experts == 4 and config.num_experts_per_tok == 2
  assert config.expert_dim == 16 and config.head_dim == (8 if kind == "qwen2_moe" else 16)
  assert config.norm_topk_prob == (kind != "qwen3_moe")
  assert config.shared_expert_intermediate_size == (24 if kind == "qwen2_moe" else 0)
  assert config.qk_norm == (kind == "qwen3_moe") and config.qkv_bias == (kind == "qwen2_moe")
  assert config.tie_embeddings == hf_cfg.tie_word_embeddings
  out = model(jnp.asarray(c.tokens), return_routing=True)
  np.testing.assert_allclose(np.asarray(out.logits), c.logits, atol=1e-4, rtol=0)
  want = _hf_forward(c.model, c.tokens)
  np.testing.assert_allclose(float(out.aux_loss), float(want.aux_loss), atol=1e-5, rtol=0)
  # The recorded routing is HF's top-k of each layer's router logits.
  for layer, logits in enumerate(want.router_logits):
    top = np.sort(logits.topk(2, dim=-1).indices.numpy(), axis=-1)
    np.testing.assert_array_equal(np.sort(np.asarray(out.routing[layer]).reshape(-1, 2), -1), top)


def test_left_padded_aux_loss_equals_transformers_attention_mask(case):
  c, model, _ = case("qwen3_moe")
  tokens = c.tokens[:, :20].copy()
  start = np.array([0, 5])
  mask = (np.arange(20)[None, :] >= start[:, None]).astype(np.int64)
  positions = np.maximum(np.arange(20)[None, :] - start[:, None], 0)
  tokens[1, :5] = 0
  want = _hf_forward(c.model, tokens, attention_mask=mask, position_ids=positions)
  out = model(jnp.asarray(tokens), start=jnp.asarray(start, jnp.int32))
  np.testing.assert_allclose(
    np.asarray(out.logits)[mask == 1], want.logits.numpy()[mask == 1], atol=1e-4, rtol=0
  )
  np.testing.assert_allclose(float(out.aux_loss), float(want.aux_loss), atol=1e-5, rtol=0)


def test_greedy_generation_equals_transformers_generate(case):
  c, model, _ = case("qwen3_moe")
  prompts = c.tokens[:, :8]
  expected = hf_fixtures.hf_greedy(c.model, prompts, 16)
  np.testing.assert_array_equal(hf_fixtures.our_greedy(model, prompts, 16), expected)


def test_export_roundtrip(case, tmp_path):
  import transformers

  c, model, config = case("qwen3_moe")
  out = str(tmp_path / "out")
  hf.save_pretrained(model, config, out, max_shard_size="20KB")
  assert os.path.isfile(os.path.join(out, "model.safetensors.index.json"))
  back = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  assert type(back) is type(c.model)
  np.testing.assert_allclose(hf_fixtures.hf_logits(back, c.tokens), c.logits, atol=1e-5, rtol=0)
  reloaded, config2 = hf.load_pretrained(out)
  assert config2 == config
  for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(reloaded))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# (qwen3_moe export is tested by the round trip above.)
@pytest.mark.parametrize(
  "variant, model_type",
  [
    (dict(qk_norm=False, rope_theta=1e6), "mixtral"),
    (
      dict(
        qk_norm=False, shared_expert_intermediate_size=24, norm_topk_prob=False, tie_embeddings=True
      ),
      "qwen2_moe",
    ),  # without q/k/v bias
  ],
)
def test_native_moe_decoder_exports(variant, model_type, tmp_path):
  import transformers

  config = models.preset(
    "nano_moe", vocab_size=50, max_seq_len=128, num_experts=4, moe_intermediate_size=32, **variant
  )
  assert hf_config.infer_model_type(config) == model_type
  model = hf_fixtures.random_decoder(config)
  tokens = np.random.default_rng(0).integers(0, 50, (2, 24)).astype(np.int32)
  ours = model(jnp.asarray(tokens))
  hf.save_pretrained(nnx.state(model, nnx.Param), config, str(tmp_path))
  with open(tmp_path / "config.json") as f:
    assert json.load(f)["model_type"] == model_type
  back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
  want = _hf_forward(back, tokens)
  np.testing.assert_allclose(want.logits.numpy(), np.asarray(ours.logits), atol=1e-4, rtol=0)
  np.testing.assert_allclose(float(want.aux_loss), float(ours.aux_loss), atol=1e-5, rtol=0)
  if model_type == "mixtral":  # Mixtral's intermediate_size is the expert width; mlp_dim unused
    config = dataclasses.replace(config, mlp_dim=config.expert_dim)
  assert hf.load_config(str(tmp_path)) == config


def test_unsupported_moe_configs():
  base = dict(
    model_type="qwen3_moe",
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts=4,
    num_experts_per_tok=2,
  )
  cfg = hf_config.config_from_hf(base)
  assert (cfg.num_experts, cfg.expert_dim, cfg.mlp_dim, cfg.norm_topk_prob) == (4, 16, 64, False)
  v5 = dict(base, num_local_experts=4)
  del v5["num_experts"]
  assert hf_config.config_from_hf(v5) == cfg
  with pytest.raises(hf.HFError, match=r"mixed dense/sparse.*layers \[0, 2\] are dense"):
    hf_config.config_from_hf(dict(base, decoder_sparse_step=2))
  with pytest.raises(hf.HFError, match=r"layers \[3\] are dense"):
    hf_config.config_from_hf(dict(base, mlp_only_layers=[3]))
  with pytest.raises(hf.HFError, match="sliding_window=4096"):
    hf_config.config_from_hf(
      dict(base, model_type="mixtral", intermediate_size=16, sliding_window=4096)
    )
  moe_cfg = models.preset("nano_moe")
  with pytest.raises(hf.HFError, match="is a 'qwen3_moe' model, not 'qwen3'"):
    hf_config.hf_config_dict(moe_cfg, "qwen3")
  with pytest.raises(hf.HFError, match="q/k/v bias and no shared expert"):
    hf_config.infer_model_type(models.preset("nano_moe", qk_norm=False, qkv_bias=True))
  with pytest.raises(hf.HFError, match="norm_topk_prob=False"):
    hf_config.infer_model_type(models.preset("nano_moe", qk_norm=False, norm_topk_prob=False))
