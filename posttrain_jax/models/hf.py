"""Hugging Face interop: load local HF checkpoints into the decoder, and export it back.

Supported:

* model types ``qwen2`` (Qwen2 / Qwen2.5: q/k/v bias), ``qwen3`` (per-head q/k RMSNorm, explicit
  ``head_dim``) and ``llama`` (Llama 2/3, including Llama 3.1 ``rope_type: llama3`` scaling;
  ``linear`` RoPE scaling too), tied or untied embeddings, GQA;
* mixtures of experts (``models/moe.py``): ``qwen3_moe`` (Qwen3-MoE), ``qwen2_moe`` (Qwen2-MoE,
  shared expert with a sigmoid gate) and ``mixtral``, with every layer sparse, read from and
  written to the per-expert tensor layout (``mlp.experts.{e}.gate_proj`` ...);
* ``config.json`` in transformers v4 or v5 spelling (``rope_theta``/``rope_scaling`` or
  ``rope_parameters``, ``torch_dtype`` or ``dtype``);
* safetensors weights, one ``model.safetensors`` or shards with ``model.safetensors.index.json``,
  float32 / bfloat16 / float16 tensors, streamed one tensor at a time (no torch at run time),
  loaded in the checkpoint's dtype (float16 as float32) unless ``dtype=`` says otherwise;
  with a ``mesh``, each parameter is placed with the NamedSharding its logical axis names get
  from the rule table (default: the trainer's FSDP + tensor-parallel rules);
* export (:func:`save_pretrained`) to a folder ``transformers.AutoModelForCausalLM`` loads, in
  float32, bfloat16 or float16, sharded above ``max_shard_size``, plus the tokenizer if given.

Not supported (a clear error names the feature): sliding-window or per-layer-type attention,
``attention_bias`` on Llama/Qwen3 (an o_proj bias), ``mlp_bias``, partial rotary, RoPE types
other than default/linear/llama3, ``.bin`` checkpoints, MoE stacks mixing dense and sparse
layers (``decoder_sparse_step`` > 1, ``mlp_only_layers``), Mixtral's sliding window, other
architectures (add a table to ``hf_weights.TENSOR_MAPS``). Mixtral's ``router_jitter_noise``
(training-time input noise) is ignored. Export gathers each parameter on this host, so it needs
fully addressable arrays (one process).
"""

import glob
import json
import os

import jax
import numpy as np
from flax import nnx

from posttrain_jax import parallel
from posttrain_jax.models import hf_weights
from posttrain_jax.models.config import ModelConfig
from posttrain_jax.models.hf_config import (
  SUPPORTED_MODEL_TYPES,
  HFError,
  HFMissingFileError,
  config_from_hf,
  hf_config_dict,
  infer_model_type,
  read_config_json,
)
from posttrain_jax.models.tokenizer import load_tokenizer
from posttrain_jax.models.transformer import Decoder

__all__ = [
  "SUPPORTED_MODEL_TYPES",
  "HFError",
  "infer_model_type",
  "load_config",
  "load_hf_tokenizer",
  "load_pretrained",
  "logical_sharding",
  "save_pretrained",
]


def load_config(path: str, *, dtype=None) -> ModelConfig:
  """The :class:`ModelConfig` of the HF folder ``path`` (see ``hf_config.config_from_hf``)."""
  return config_from_hf(read_config_json(path), dtype=dtype)


def load_hf_tokenizer(path: str):
  """The folder's tokenizer (``AutoTokenizer``, offline); its chat template, if the folder has
  one, is used by ``tokenizer.apply_chat_template``."""
  if os.path.isdir(path) and not any(
    os.path.isfile(os.path.join(path, f))
    for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
  ):
    raise HFMissingFileError(
      f"{path!r} has no tokenizer files (tokenizer.json / "
      "tokenizer_config.json); save the model's tokenizer there with "
      "tokenizer.save_pretrained"
    )
  try:
    return load_tokenizer(path)
  except (OSError, ValueError) as e:
    raise HFError(f"cannot load the tokenizer of {path!r}: {e}") from None


def check_tokenizer_fits(config: ModelConfig, tokenizer, path: str) -> None:
  """HFError unless every token id of ``tokenizer`` (its vocabulary and special tokens) has a
  row in the model's embedding (``config.vocab_size``): an id beyond it reads out of range and
  trains on NaN."""
  problems = [f"{len(tokenizer)} tokens"] if len(tokenizer) > config.vocab_size else []
  for name in ("eos_token_id", "pad_token_id", "bos_token_id", "unk_token_id"):
    value = getattr(tokenizer, name, None)
    if value is not None and not 0 <= value < config.vocab_size:
      problems.append(f"{name}={value}")
  if problems:
    raise HFError(
      f"the tokenizer of {path!r} does not fit its model: {', '.join(problems)}, "
      f"but the model has {config.vocab_size} embedding rows (vocab_size in "
      "config.json); use the tokenizer saved with this model"
    )


def logical_sharding(names, shape, mesh: jax.sharding.Mesh, rules) -> jax.sharding.NamedSharding:
  """NamedSharding of an array with logical axis ``names`` under a rule table.

  Rules map a logical name to a mesh axis, a tuple of axes, or None. Axes missing from the
  mesh, already used by an earlier dimension, or not dividing the dimension are dropped (that
  dimension is then replicated), so any checkpoint loads on any mesh.
  """
  table = dict(rules)
  used, spec = set(), []
  for name, dim in zip(names or (None,) * len(shape), shape):
    axes = table.get(name)
    axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
    axes = tuple(a for a in axes if a in mesh.shape and a not in used)
    if axes and dim % int(np.prod([mesh.shape[a] for a in axes])):
      axes = ()
    used.update(axes)
    spec.append(None if not axes else axes[0] if len(axes) == 1 else axes)
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))


def load_pretrained(
  path: str, *, dtype=None, mesh: jax.sharding.Mesh | None = None, rules=None
) -> tuple[Decoder, ModelConfig]:
  """Loads a local HF checkpoint folder as a :class:`Decoder`.

  Args:
    path: folder with ``config.json`` and safetensors weights.
    dtype: 'float32' or 'bfloat16' for parameters and activations; default the checkpoint's.
    mesh: place each parameter on this mesh (sharded by ``rules``); default one device.
    rules: a logical-axis rule table or a role name ('trainer', 'sampler'); default 'trainer'.

  Returns:
    (model, config); ``model(tokens [B, T] int32)`` returns an LMOutput with logits [B, T, V].
  """
  hf = read_config_json(path)
  config = config_from_hf(hf, dtype=dtype)
  maps = hf_weights.TENSOR_MAPS[hf["model_type"]]
  if isinstance(rules, str) or rules is None:
    rules = parallel.rules_for_role(rules or "trainer")
  abstract = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  variables = {"/".join(map(str, p)): v for p, v in nnx.to_flat_state(state)}
  used = set()
  with hf_weights.SafetensorsReader(path) as reader:
    for m in maps:
      if m.ours not in variables:
        continue
      var = variables.pop(m.ours)
      shape, dtype_ = var.get_value().shape, var.get_value().dtype
      if mesh is None:
        sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
      else:
        sharding = logical_sharding(var.get_metadata().get("out_sharding"), shape, mesh, rules)
      var.set_value(hf_weights.read_param(reader, m, shape, dtype_, sharding))
      used.update(name for _, name in hf_weights.hf_names(m, shape))
    if config.tied and "lm_head.weight" in reader.weight_map:
      used.add("lm_head.weight")  # some tied checkpoints store the copy; it is the embedding
    if variables:
      raise HFError(f"no weight mapping for parameter(s) {sorted(variables)}")
    hf_weights.check_unused(reader, used)
  return nnx.merge(graphdef, state), config


def _flat_params(params_or_model) -> dict[str, jax.Array]:
  """'/'-path -> array from a Decoder, an nnx.State, or a nested dict of arrays."""
  if isinstance(params_or_model, nnx.Module):
    params_or_model = nnx.state(params_or_model, nnx.Param)
  if isinstance(params_or_model, nnx.State):
    params_or_model = nnx.to_pure_dict(params_or_model)
  flat = {}

  def walk(prefix, node):
    if isinstance(node, dict):
      for k, v in node.items():
        walk(f"{prefix}/{k}" if prefix else str(k), v)
    else:
      flat[prefix] = node[...] if isinstance(node, nnx.Variable) else node

  walk("", dict(params_or_model))
  return flat


def save_pretrained(
  params_or_model,
  config: ModelConfig,
  path: str,
  *,
  model_type: str | None = None,
  tokenizer=None,
  dtype: str = "float32",
  max_shard_size: int | str = "5GB",
) -> None:
  """Writes an HF folder (config.json, safetensors, tokenizer) that transformers loads.

  Args:
    params_or_model: a Decoder, its nnx.State, or a nested dict of arrays with its paths.
    config: the decoder's ModelConfig.
    path: output folder (created; earlier weight files in it are removed).
    model_type: 'llama', 'qwen2', 'qwen3', 'qwen3_moe', 'qwen2_moe' or 'mixtral'; default the
      family the config is (``hf_config.infer_model_type``: qk-norm -> qwen3, q/k/v bias ->
      qwen2, else llama; with experts qk-norm -> qwen3_moe, a shared expert -> qwen2_moe, else
      mixtral). A mismatch raises HFError.
    tokenizer: saved beside the weights, and its special-token ids written to the config.
    dtype: tensor dtype on disk: 'float32', 'bfloat16' or 'float16'.
    max_shard_size: bytes or e.g. '5GB'; larger checkpoints are split with an index json.
  """
  if dtype not in hf_weights.NP_DTYPES:
    raise HFError(f"dtype must be one of {', '.join(hf_weights.NP_DTYPES)}, got {dtype!r}")
  hf = hf_config_dict(config, model_type, dtype=dtype, tokenizer=tokenizer)
  params = _flat_params(params_or_model)
  maps = hf_weights.TENSOR_MAPS[hf["model_type"]]
  known = {m.ours for m in maps}
  unknown = sorted(set(params) - known)
  if unknown:
    raise HFError(f"parameters {unknown} have no {hf['model_type']} mapping")
  missing = sorted(m.ours for m in maps if m.ours not in params and not _optional(m, config))
  if missing:
    raise HFError(f"the parameters lack {missing} that config requires")
  os.makedirs(path, exist_ok=True)
  for old in glob.glob(os.path.join(path, "model*.safetensors")) + [
    os.path.join(path, hf_weights.INDEX_FILE)
  ]:
    if os.path.isfile(old):
      os.remove(old)
  hf_weights.write_safetensors(
    params, maps, path, dtype=dtype, max_shard_bytes=hf_weights.parse_size(max_shard_size)
  )
  with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
    json.dump(hf, f, indent=2, sort_keys=True)
  if tokenizer is not None:
    tokenizer.save_pretrained(path)
    generation = {k: v for k, v in hf.items() if k.endswith("_token_id") and v is not None}
    with open(os.path.join(path, "generation_config.json"), "w", encoding="utf-8") as f:
      json.dump(generation, f, indent=2, sort_keys=True)


def _optional(m: hf_weights.TensorMap, config: ModelConfig) -> bool:
  """Whether a mapped parameter may be absent: a tied head, q/k/v bias of a bias-free qwen2_moe."""
  if m.ours == "lm_head":
    return config.tied
  return m.ours.endswith("_bias") and not config.qkv_bias
