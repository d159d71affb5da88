"""Weight layout between Hugging Face safetensors and the decoder's stacked parameters.

A per-family table maps each of our parameters (``'layers/q'``) to a Hugging Face tensor name
template (``'model.layers.{i}.self_attn.q_proj.weight'``), the index names it is stacked over
(``('i',)`` for the leading ``layers`` axis; an MoE table adds ``('i', 'e')``) and a layout kind.
Torch ``Linear`` weights are ``[out, in]``; ours are ``[in, ...]`` with heads split out.

Reading streams one Hugging Face tensor at a time (``safe_open(framework="numpy")``, bfloat16
through ml_dtypes) into per-shard host buffers, then places each parameter on its devices, so
the model is never held twice on a host. Writing plans the file shards from shapes first, then
fetches one parameter at a time.
"""

import contextlib
import dataclasses
import itertools
import json
import os
import re
from typing import Iterator

import jax
import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from posttrain_jax.models.hf_config import HFError, HFMissingFileError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Tensors a checkpoint may carry that the decoder recomputes.
_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")


@dataclasses.dataclass(frozen=True)
class TensorMap:
  """One of our parameters and the Hugging Face tensor(s) it is made of.

  Attributes:
    ours: '/'-joined path in the decoder's state, e.g. ``'layers/q'``.
    hf: Hugging Face name, with ``{i}`` (layer) / ``{e}`` (expert) placeholders when stacked.
    kind: layout (see ``to_ours``): 'copy', 'linear', 'in_heads', 'out_heads', 'bias_heads'.
    stack: placeholder names of the leading stacked axes, outermost first.
  """

  ours: str
  hf: str
  kind: str
  stack: tuple[str, ...] = ()


def _layer(ours: str, hf: str, kind: str) -> TensorMap:
  return TensorMap(ours, "model.layers.{i}." + hf, kind, ("i",))


def _expert(ours: str, hf: str, kind: str) -> TensorMap:
  return TensorMap(ours, "model.layers.{i}." + hf, kind, ("i", "e"))


_ATTENTION = (
  TensorMap("embed", "model.embed_tokens.weight", "copy"),
  TensorMap("final_norm", "model.norm.weight", "copy"),
  TensorMap("lm_head", "lm_head.weight", "linear"),
  _layer("layers/attn_norm", "input_layernorm.weight", "copy"),
  _layer("layers/q", "self_attn.q_proj.weight", "in_heads"),
  _layer("layers/k", "self_attn.k_proj.weight", "in_heads"),
  _layer("layers/v", "self_attn.v_proj.weight", "in_heads"),
  _layer("layers/o", "self_attn.o_proj.weight", "out_heads"),
  _layer("layers/mlp_norm", "post_attention_layernorm.weight", "copy"),
)
_DENSE = _ATTENTION + (
  _layer("layers/gate", "mlp.gate_proj.weight", "linear"),
  _layer("layers/up", "mlp.up_proj.weight", "linear"),
  _layer("layers/down", "mlp.down_proj.weight", "linear"),
)
# Mixtures of experts: router [L, D, E] <- [E, D] per layer; experts [L, E, D, F] <- [F, D]
# per layer and expert (the per-expert checkpoint layout transformers v4 and v5 both write).
_QWEN_MOE = (
  _layer("layers/router", "mlp.gate.weight", "linear"),
  _expert("layers/experts_gate", "mlp.experts.{e}.gate_proj.weight", "linear"),
  _expert("layers/experts_up", "mlp.experts.{e}.up_proj.weight", "linear"),
  _expert("layers/experts_down", "mlp.experts.{e}.down_proj.weight", "linear"),
)
_SHARED_EXPERT = (
  _layer("layers/shared_gate", "mlp.shared_expert.gate_proj.weight", "linear"),
  _layer("layers/shared_up", "mlp.shared_expert.up_proj.weight", "linear"),
  _layer("layers/shared_down", "mlp.shared_expert.down_proj.weight", "linear"),
  _layer("layers/shared_expert_gate", "mlp.shared_expert_gate.weight", "linear"),
)
_MIXTRAL = (
  _layer("layers/router", "block_sparse_moe.gate.weight", "linear"),
  _expert("layers/experts_gate", "block_sparse_moe.experts.{e}.w1.weight", "linear"),
  _expert("layers/experts_up", "block_sparse_moe.experts.{e}.w3.weight", "linear"),
  _expert("layers/experts_down", "block_sparse_moe.experts.{e}.w2.weight", "linear"),
)
_QKV_BIAS = (
  _layer("layers/q_bias", "self_attn.q_proj.bias", "bias_heads"),
  _layer("layers/k_bias", "self_attn.k_proj.bias", "bias_heads"),
  _layer("layers/v_bias", "self_attn.v_proj.bias", "bias_heads"),
)
_QK_NORM = (
  _layer("layers/q_norm", "self_attn.q_norm.weight", "copy"),
  _layer("layers/k_norm", "self_attn.k_norm.weight", "copy"),
)
# Parameters absent from our state (lm_head when tied, q/k/v bias of a bias-free qwen2_moe) are
# skipped.
TENSOR_MAPS: dict[str, tuple[TensorMap, ...]] = {
  "llama": _DENSE,
  "qwen2": _DENSE + _QKV_BIAS,
  "qwen3": _DENSE + _QK_NORM,
  "qwen3_moe": _ATTENTION + _QK_NORM + _QWEN_MOE,
  "qwen2_moe": _ATTENTION + _QKV_BIAS + _QWEN_MOE + _SHARED_EXPERT,
  "mixtral": _ATTENTION + _MIXTRAL,
}


# -- layouts --------------------------------------------------------------------------------------
def hf_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  """The Hugging Face shape of one (unstacked) parameter of our ``shape``."""
  n = int(np.prod(shape))
  return {
    "copy": tuple(shape),
    "linear": tuple(shape[::-1]),
    "in_heads": (n // shape[0], shape[0]),  # [N*hd, D] <- [D, N, hd]
    "out_heads": (shape[-1], n // shape[-1]),  # [D, H*hd] <- [H, hd, D]
    "bias_heads": (n,),
  }[kind]  # [N*hd]    <- [N, hd]


def to_ours(kind: str, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  """Hugging Face tensor -> our layout of ``shape``."""
  if kind in ("copy", "bias_heads"):
    return x.reshape(shape)
  return x.T.reshape(shape)


def to_hf(kind: str, y: np.ndarray) -> np.ndarray:
  """Our layout -> Hugging Face tensor (inverse of :func:`to_ours`)."""
  if kind == "copy":
    return y
  if kind == "bias_heads":
    return y.reshape(-1)
  if kind == "in_heads":
    return y.reshape(y.shape[0], -1).T
  if kind == "out_heads":
    return y.reshape(-1, y.shape[-1]).T
  return y.T


def hf_names(m: TensorMap, shape: tuple[int, ...]) -> Iterator[tuple[tuple[int, ...], str]]:
  """(stack index, Hugging Face name) of every tensor making up a parameter of ``shape``."""
  for combo in itertools.product(*(range(n) for n in shape[: len(m.stack)])):
    yield combo, m.hf.format(**dict(zip(m.stack, combo)))


# -- reading --------------------------------------------------------------------------------------
def _open_safetensors(file: str):
  """``safe_open`` of one safetensors file; HFError when it is truncated or not safetensors."""
  try:
    return safe_open(file, framework="numpy")
  except Exception as e:  # pylint: disable=broad-except  (safetensors' Rust error type)
    raise HFError(
      f"{file} is not a readable safetensors file ({e}); re-save the checkpoint "
      "with save_pretrained"
    ) from None


class SafetensorsReader(contextlib.AbstractContextManager):
  """Lazy per-tensor access to a folder's ``model.safetensors`` or its sharded index."""

  def __init__(self, path: str):
    self.path = path
    index = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index):
      with open(index, encoding="utf-8") as f:
        self.weight_map = dict(json.load(f)["weight_map"])
    elif os.path.isfile(os.path.join(path, SINGLE_FILE)):
      with _open_safetensors(os.path.join(path, SINGLE_FILE)) as f:
        self.weight_map = {k: SINGLE_FILE for k in f.keys()}
    else:
      raise HFMissingFileError(
        f"{path!r} has no {SINGLE_FILE} or {INDEX_FILE} (only safetensors "
        "checkpoints are read; re-save a .bin checkpoint with "
        "save_pretrained(safe_serialization=True))"
      )
    self._stack = contextlib.ExitStack()
    self._files = {}

  def _file(self, name: str):
    if name not in self.weight_map:
      raise HFError(
        f"weight {name!r} not found in {self.path} "
        f"({len(self.weight_map)} tensors in the checkpoint): the checkpoint is "
        "incomplete or not the architecture its config.json names; re-save it "
        "with save_pretrained"
      )
    file = self.weight_map[name]
    if file not in self._files:
      full = os.path.join(self.path, file)
      if not os.path.isfile(full):
        raise HFMissingFileError(f"shard {full} named in {INDEX_FILE} does not exist")
      self._files[file] = self._stack.enter_context(_open_safetensors(full))
    return self._files[file]

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._file(name).get_slice(name).get_shape())

  def get(self, name: str) -> np.ndarray:
    return self._file(name).get_tensor(name)

  def __exit__(self, *exc):
    self._stack.close()
    self._files.clear()


def _normalize(index: tuple, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
  """A device's index (tuple of slices) as hashable (start, stop) pairs over ``shape``."""
  out = []
  for s, n in zip(tuple(index) + (slice(None),) * (len(shape) - len(index)), shape):
    start, stop, step = s.indices(n)
    if step != 1:
      raise ValueError(f"strided shard index {s} is not supported")
    out.append((start, stop))
  return tuple(out)


def read_param(
  reader: SafetensorsReader,
  m: TensorMap,
  shape: tuple[int, ...],
  dtype,
  sharding: jax.sharding.Sharding,
) -> jax.Array:
  """Our parameter ``m.ours`` of ``shape``/``dtype``, placed with ``sharding``.

  Each Hugging Face tensor is read once and copied into the host buffer of every distinct shard
  this process holds; devices then take their shard (``jax.make_array_from_callback``).
  """
  n_stack = len(m.stack)
  inner = tuple(shape[n_stack:])
  expected = hf_shape(m.kind, inner)
  boxes = {
    _normalize(idx, shape)
    for idx in sharding.addressable_devices_indices_map(tuple(shape)).values()
  }
  buffers = {b: np.empty([hi - lo for lo, hi in b], dtype) for b in boxes}
  for combo, name in hf_names(m, shape):
    holders = [b for b in boxes if all(lo <= c < hi for c, (lo, hi) in zip(combo, b))]
    if not holders:
      continue
    got = reader.shape(name)
    if got != expected:
      raise HFError(
        f"weight {name!r} in {reader.path} has shape {list(got)}, expected "
        f"{list(expected)} from config.json; config.json does not describe these "
        "weights (use the config.json saved with them)"
      )
    x = to_ours(m.kind, reader.get(name), inner)
    for b in holders:
      lead = tuple(c - lo for c, (lo, _) in zip(combo, b))
      rest = tuple(slice(lo, hi) for lo, hi in b[n_stack:])
      buffers[b][lead] = x[rest]
  return jax.make_array_from_callback(
    tuple(shape), sharding, lambda idx: buffers[_normalize(idx, shape)]
  )


def check_unused(reader: SafetensorsReader, used: set[str]) -> None:
  """Raises when the checkpoint has weights the decoder would silently drop."""
  extra = sorted(n for n in set(reader.weight_map) - used if not _IGNORED.match(n))
  if extra:
    shown = ", ".join(extra[:5]) + (f" ... ({len(extra)} in all)" if len(extra) > 5 else "")
    raise HFError(f"{reader.path} has weights this architecture does not use: {shown}")


# -- writing --------------------------------------------------------------------------------------
_UNITS = {
  "": 1,
  "B": 1,
  "KB": 10**3,
  "MB": 10**6,
  "GB": 10**9,
  "TB": 10**12,
  "KIB": 2**10,
  "MIB": 2**20,
  "GIB": 2**30,
  "TIB": 2**40,
}


def parse_size(size: int | str) -> int:
  """Bytes from an int or a string like '5GB', '200MB', '10KiB' (Hugging Face units)."""
  if isinstance(size, int):
    return size
  match = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", str(size))
  if not match or match.group(2).upper() not in _UNITS:
    raise HFError(f"bad shard size {size!r}; use bytes or e.g. '5GB', '500MB'")
  return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


NP_DTYPES = {
  "float32": np.dtype(np.float32),
  "bfloat16": np.dtype(ml_dtypes.bfloat16),
  "float16": np.dtype(np.float16),
}


def write_safetensors(
  params: dict[str, jax.Array],
  maps: tuple[TensorMap, ...],
  path: str,
  *,
  dtype: str,
  max_shard_bytes: int,
) -> list[str]:
  """Writes ``params`` (flat '/'-path -> array) as HF safetensors; returns the files written.

  Shards are planned from shapes; arrays are fetched to the host one parameter at a time.
  """
  np_dtype = NP_DTYPES[dtype]
  plan, shard, size, total = [], [], 0, 0  # plan: list of shards, each [(map, combo, name)]
  for m in maps:
    if m.ours not in params:
      continue
    shape = tuple(params[m.ours].shape)
    nbytes = int(np.prod(shape[len(m.stack) :])) * np_dtype.itemsize
    for combo, name in hf_names(m, shape):
      if shard and size + nbytes > max_shard_bytes:
        plan.append(shard)
        shard, size = [], 0
      shard.append((m, combo, name))
      size += nbytes
      total += nbytes
  plan.append(shard)
  files = (
    [SINGLE_FILE]
    if len(plan) == 1
    else [f"model-{k + 1:05d}-of-{len(plan):05d}.safetensors" for k in range(len(plan))]
  )
  weight_map, host = {}, (None, None)
  for file, entries in zip(files, plan):
    tensors = {}
    for m, combo, name in entries:
      if host[0] != m.ours:
        host = (m.ours, np.asarray(jax.device_get(params[m.ours])))
      tensors[name] = np.ascontiguousarray(to_hf(m.kind, host[1][combo]).astype(np_dtype))
      weight_map[name] = file
    save_file(tensors, os.path.join(path, file), metadata={"format": "pt"})
  if len(files) > 1:
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(path, INDEX_FILE), "w", encoding="utf-8") as f:
      json.dump(index, f, indent=2)
  return files
