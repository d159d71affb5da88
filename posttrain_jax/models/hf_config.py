"""Hugging Face ``config.json`` <-> :class:`ModelConfig` for the Llama / Qwen2 / Qwen3 family and
its mixtures of experts (Qwen3-MoE, Qwen2-MoE, Mixtral).

Reads transformers v4 and v5 keys: RoPE at top level (``rope_theta`` + ``rope_scaling``, v4) or
in ``rope_parameters`` (v5); ``dtype`` (v5) or ``torch_dtype`` (v4); ``head_dim`` explicit or
``hidden_size / num_attention_heads``; ``num_experts`` (v4 Qwen) or ``num_local_experts`` (v5,
Mixtral). Writes both spellings so either version loads the result.

Mixtures of experts must be sparse in every layer (``decoder_sparse_step=1`` and no
``mlp_only_layers``): the decoder scans one stacked block, so mixed dense/sparse stacks raise.
"""

import json
import os

from posttrain_jax.models.config import ROPE_TYPES, ModelConfig

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "mixtral")
MOE_MODEL_TYPES = ("qwen3_moe", "qwen2_moe", "mixtral")
ARCHITECTURES = {
  "llama": "LlamaForCausalLM",
  "qwen2": "Qwen2ForCausalLM",
  "qwen3": "Qwen3ForCausalLM",
  "qwen3_moe": "Qwen3MoeForCausalLM",
  "qwen2_moe": "Qwen2MoeForCausalLM",
  "mixtral": "MixtralForCausalLM",
}
_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float32", "float64": "float32"}


class HFError(ValueError):
  """A Hugging Face folder cannot be read or written as this library's decoder."""


class HFMissingFileError(HFError, FileNotFoundError):
  """A file the Hugging Face folder needs (config, weights, tokenizer) is not there."""


def read_config_json(path: str) -> dict:
  """The parsed ``config.json`` of the Hugging Face folder ``path``."""
  if not os.path.isdir(path):
    raise HFMissingFileError(f"no Hugging Face model folder at {path!r}")
  file = os.path.join(path, "config.json")
  if not os.path.isfile(file):
    raise HFMissingFileError(f"{path!r} has no config.json; is it a Hugging Face model folder?")
  with open(file, encoding="utf-8") as f:
    try:
      return json.load(f)
    except json.JSONDecodeError as e:
      raise HFError(f"{file} is not valid JSON ({e})") from e


def check_model_type(model_type) -> str:
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise HFError(
      f"unsupported model_type {model_type!r}; supported model types: "
      f"{', '.join(SUPPORTED_MODEL_TYPES)}"
    )
  return model_type


def _rope_fields(hf: dict) -> dict:
  """ModelConfig RoPE fields from v5 ``rope_parameters`` or v4 ``rope_theta``/``rope_scaling``."""
  params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
  if params and all(isinstance(v, dict) for v in params.values()):
    raise HFError(
      f"per-layer-type RoPE parameters are not supported (rope_parameters keys {sorted(params)})"
    )
  theta = params.get("rope_theta", hf.get("rope_theta", 10_000.0))
  rope_type = params.get("rope_type", params.get("type", "default"))
  if rope_type not in ROPE_TYPES:
    raise HFError(f"unsupported RoPE type {rope_type!r}; supported: {', '.join(ROPE_TYPES)}")
  partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
  if partial != 1.0:
    raise HFError(f"partial_rotary_factor={partial} is not supported (only 1.0)")
  fields = dict(rope_theta=float(theta), rope_type=rope_type)
  if rope_type in ("linear", "llama3"):
    fields["rope_factor"] = float(params["factor"])
  if rope_type == "llama3":
    original = params.get(
      "original_max_position_embeddings",
      hf.get("original_max_position_embeddings", hf.get("max_position_embeddings")),
    )
    fields.update(
      rope_low_freq_factor=float(params["low_freq_factor"]),
      rope_high_freq_factor=float(params["high_freq_factor"]),
      rope_original_max_len=int(original),
    )
  return fields


def _check_architecture(hf: dict, model_type: str) -> None:
  """Rejects features of the family that the decoder does not implement."""
  act = hf.get("hidden_act", "silu")
  if act not in ("silu", "swish"):
    raise HFError(f"hidden_act={act!r} is not supported (only silu / SwiGLU)")
  if model_type not in ("qwen2", "qwen2_moe") and hf.get("attention_bias", False):
    raise HFError(f"{model_type} with attention_bias=true (an o_proj bias) is not supported")
  if hf.get("mlp_bias", False):
    raise HFError("mlp_bias=true is not supported")
  if hf.get("use_sliding_window", False):
    raise HFError("use_sliding_window=true (sliding-window attention) is not supported")
  if model_type == "mixtral" and hf.get("sliding_window") is not None:
    raise HFError(
      f"mixtral with sliding_window={hf['sliding_window']} (sliding-window attention) "
      "is not supported"
    )
  types = set(hf.get("layer_types") or ["full_attention"])
  if types != {"full_attention"}:
    raise HFError(f"layer_types {sorted(types)} are not supported (only full_attention)")


def dtype_name(dtype) -> str | None:
  """'float32' / 'bfloat16' from a name or numpy/jax dtype; None stays None."""
  if dtype is None:
    return None
  name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
  name = name.replace("torch.", "")
  if name not in ("float32", "bfloat16"):
    raise HFError(f"dtype must be float32 or bfloat16, got {dtype!r}")
  return name


def config_from_hf(hf: dict, *, dtype=None) -> ModelConfig:
  """A :class:`ModelConfig` from a parsed HF ``config.json``.

  ``dtype`` (parameters and activations) defaults to the checkpoint's ``dtype``/``torch_dtype``
  (float16 is read as float32, which the decoder supports).
  """
  model_type = check_model_type(hf.get("model_type"))
  _check_architecture(hf, model_type)
  try:
    heads = int(hf["num_attention_heads"])
    hidden = int(hf["hidden_size"])
    fields = dict(
      vocab_size=int(hf["vocab_size"]),
      hidden_size=hidden,
      num_layers=int(hf["num_hidden_layers"]),
      num_heads=heads,
      num_kv_heads=int(hf.get("num_key_value_heads") or heads),
      head_dim=int(hf.get("head_dim") or hidden // heads),
      mlp_dim=int(hf["intermediate_size"]),
    )
  except KeyError as e:
    raise HFError(f"config.json lacks the required key {e.args[0]!r}") from e
  if model_type in MOE_MODEL_TYPES:
    fields.update(_moe_fields(hf, model_type, fields["num_layers"]))
  name = dtype_name(dtype) or _DTYPES.get(hf.get("dtype") or hf.get("torch_dtype"), "float32")
  qkv_bias = model_type == "qwen2" or (model_type == "qwen2_moe" and bool(hf.get("qkv_bias", True)))
  return ModelConfig(
    **fields,
    **_rope_fields(hf),
    rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
    qkv_bias=qkv_bias,
    qk_norm=model_type in ("qwen3", "qwen3_moe"),
    tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    max_seq_len=int(hf.get("max_position_embeddings", 2048)),
    dtype=name,
    param_dtype=name,
  )


def _moe_fields(hf: dict, model_type: str, num_layers: int) -> dict:
  """ModelConfig mixture-of-experts fields of a qwen3_moe / qwen2_moe / mixtral config."""
  try:
    experts = int(hf.get("num_experts") or hf["num_local_experts"])
    top_k = int(hf["num_experts_per_tok"])
    if model_type == "mixtral":  # experts are intermediate_size wide; always renormalised
      width, norm = int(hf["intermediate_size"]), True
    else:
      width, norm = int(hf["moe_intermediate_size"]), bool(hf.get("norm_topk_prob", False))
  except KeyError as e:
    raise HFError(f"config.json lacks the required key {e.args[0]!r}") from e
  if experts <= 0:
    raise HFError(f"{model_type} with num_experts={experts} (no experts) is not supported")
  step = int(hf.get("decoder_sparse_step", 1) or 1)
  only = set(hf.get("mlp_only_layers") or [])
  dense = [i for i in range(num_layers) if i in only or (i + 1) % step]
  if dense:
    raise HFError(
      f"mixed dense/sparse layer stacks are not supported: layers {dense} are dense "
      f"(decoder_sparse_step={step}, mlp_only_layers={sorted(only)}); the decoder "
      "needs every layer sparse"
    )
  shared = int(hf.get("shared_expert_intermediate_size", 0)) if model_type == "qwen2_moe" else 0
  if model_type == "qwen2_moe" and shared <= 0:
    raise HFError(f"qwen2_moe with shared_expert_intermediate_size={shared} is not supported")
  return dict(
    num_experts=experts,
    num_experts_per_tok=top_k,
    moe_intermediate_size=width,
    norm_topk_prob=norm,
    shared_expert_intermediate_size=shared,
    router_aux_loss_coef=float(hf.get("router_aux_loss_coef", 0.001)),
  )


def infer_model_type(config: ModelConfig) -> str:
  """The HF family a config is exactly.

  Dense: qk-norm -> qwen3, q/k/v bias -> qwen2, else llama. Mixture of experts: qk-norm ->
  qwen3_moe, a shared expert -> qwen2_moe (q/k/v bias optional), else mixtral (which always
  renormalises the top-k gates).
  """
  if config.qk_norm and config.qkv_bias:
    raise HFError("a decoder with both qk_norm and qkv_bias has no Hugging Face equivalent")
  if not config.num_experts:
    return "qwen3" if config.qk_norm else "qwen2" if config.qkv_bias else "llama"
  shared = config.shared_expert_intermediate_size
  if config.qk_norm and shared:
    raise HFError(
      "a mixture of experts with qk_norm and a shared expert has no Hugging Face equivalent"
    )
  if config.qk_norm:
    return "qwen3_moe"
  if shared:
    return "qwen2_moe"
  if config.qkv_bias:
    raise HFError(
      "a mixture of experts with q/k/v bias and no shared expert has no Hugging Face equivalent"
    )
  if not config.norm_topk_prob:
    raise HFError(
      "a mixture of experts without qk_norm or a shared expert is a Mixtral, which "
      "renormalises its top-k gates: norm_topk_prob=False has no Hugging Face "
      "equivalent"
    )
  return "mixtral"


def hf_config_dict(
  config: ModelConfig, model_type: str | None = None, *, dtype: str = "float32", tokenizer=None
) -> dict:
  """The ``config.json`` contents that transformers' AutoModelForCausalLM loads as ``config``."""
  if config.output_dim:
    raise HFError(
      f"a model with output_dim={config.output_dim} (not an LM head) cannot be "
      "exported as a causal LM"
    )
  exact = infer_model_type(config)
  model_type = exact if model_type is None else check_model_type(model_type)
  if model_type != exact:
    features = f"qk_norm={config.qk_norm}, qkv_bias={config.qkv_bias}"
    if config.num_experts:
      features += (
        f", num_experts={config.num_experts}, shared_expert_intermediate_size="
        f"{config.shared_expert_intermediate_size}"
      )
    raise HFError(
      f"this model ({features}) is a {exact!r} model, not {model_type!r}: "
      f"pass model_type={exact!r} (or None)"
    )
  rope = {"rope_type": config.rope_type, "rope_theta": config.rope_theta}
  if config.rope_type in ("linear", "llama3"):
    rope["factor"] = config.rope_factor
  if config.rope_type == "llama3":
    rope.update(
      low_freq_factor=config.rope_low_freq_factor,
      high_freq_factor=config.rope_high_freq_factor,
      original_max_position_embeddings=config.rope_original_max_len,
    )
  scaling = (
    None if config.rope_type == "default" else {k: v for k, v in rope.items() if k != "rope_theta"}
  )
  out = {
    "architectures": [ARCHITECTURES[model_type]],
    "model_type": model_type,
    "vocab_size": config.vocab_size,
    "hidden_size": config.hidden_size,
    "intermediate_size": config.mlp_dim,
    "num_hidden_layers": config.num_layers,
    "num_attention_heads": config.num_heads,
    "num_key_value_heads": config.num_kv_heads,
    "head_dim": config.head_dim,
    "hidden_act": "silu",
    "max_position_embeddings": config.max_seq_len,
    "rms_norm_eps": config.rms_norm_eps,
    "rope_theta": config.rope_theta,
    "rope_scaling": scaling,
    "rope_parameters": rope,
    "tie_word_embeddings": config.tie_embeddings,
    "dtype": dtype,
    "torch_dtype": dtype,
    "use_cache": True,
    "initializer_range": 0.02,
    "attention_dropout": 0.0,
  }
  if model_type in ("llama", "qwen3", "qwen3_moe"):
    out.update(attention_bias=False)
  if model_type == "llama":
    out.update(mlp_bias=False)
  elif model_type == "mixtral":
    out.update(sliding_window=None)
  else:
    out.update(use_sliding_window=False, sliding_window=None, max_window_layers=config.num_layers)
  if config.num_experts:
    out.update(_moe_dict(config, model_type))
  out.update(special_token_ids(tokenizer))
  return out


def _moe_dict(config: ModelConfig, model_type: str) -> dict:
  """The mixture-of-experts keys of a qwen3_moe / qwen2_moe / mixtral ``config.json``."""
  out = dict(
    num_experts_per_tok=config.num_experts_per_tok,
    output_router_logits=False,
    router_aux_loss_coef=config.router_aux_loss_coef,
  )
  if model_type == "mixtral":
    return dict(
      out,
      num_local_experts=config.num_experts,
      intermediate_size=config.expert_dim,
      router_jitter_noise=0.0,
    )
  out.update(
    num_experts=config.num_experts,
    moe_intermediate_size=config.expert_dim,
    norm_topk_prob=config.norm_topk_prob,
    decoder_sparse_step=1,
    mlp_only_layers=[],
  )
  if model_type == "qwen3_moe":
    out.update(num_local_experts=config.num_experts)  # transformers v5's name
  else:
    out.update(
      shared_expert_intermediate_size=config.shared_expert_intermediate_size,
      qkv_bias=config.qkv_bias,
    )
  return out


def special_token_ids(tokenizer) -> dict:
  """bos/eos/pad token ids of a tokenizer (None when absent or no tokenizer)."""
  ids = {}
  for name in ("bos", "eos", "pad"):
    ids[f"{name}_token_id"] = getattr(tokenizer, f"{name}_token_id", None)
  return ids
