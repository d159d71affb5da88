"""The parts of a stored program's key (parallel/executables.py) that need no tracing: the run's
fingerprint (config, checkpoint or tokenizer folders, loaded source, JAX and the devices) and
stable texts of static values, shardings and argument leaves."""

import hashlib
import os
import sys
import sysconfig
import threading
from typing import Any, Sequence

import jax
import numpy as np

FORMAT = 1  # bump when the stored layout or the key's contents change
# JAX flags whose values change what a traced function lowers to.
_JAX_FLAGS = (
  "jax_enable_x64",
  "jax_default_matmul_precision",
  "jax_numpy_rank_promotion",
  "jax_numpy_dtype_promotion",
  "jax_default_prng_impl",
  "jax_threefry_partitionable",
)
# Checkpoint and tokenizer folders: every file but the weights enters the fingerprint.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".msgpack", ".h5", ".npz", ".gguf")

_source_hashes: dict[str, tuple[float, int, str]] = {}  # path -> (mtime, size, sha256)
_lock = threading.Lock()


def _installed_roots() -> tuple[str, ...]:
  paths = sysconfig.get_paths()
  roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
  roots |= {sys.prefix, sys.base_prefix, sys.exec_prefix}
  return tuple(os.path.realpath(r) + os.sep for r in roots if r)


def _file_hash(path: str) -> str:
  """sha256 of a file's bytes, recomputed only when its mtime or size changed."""
  st = os.stat(path)
  known = _source_hashes.get(path)
  if known is not None and known[:2] == (st.st_mtime, st.st_size):
    return known[2]
  with open(path, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  _source_hashes[path] = (st.st_mtime, st.st_size, digest)
  return digest


def source_fingerprint() -> str:
  """A hash of the source of every loaded module that is not part of Python or an installed
  package: this project (an editable install included), experiment files, user modules."""
  roots = _installed_roots()
  files = set()
  for module in list(sys.modules.values()):
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py"):
      continue
    path = os.path.realpath(path)
    if not path.startswith(roots) and os.path.isfile(path):
      files.add(path)
  h = hashlib.sha256()
  with _lock:
    for path in sorted(files):
      h.update(path.encode())
      h.update(_file_hash(path).encode())
  return h.hexdigest()


def folder_fingerprint(path: str) -> str:
  """A hash of a checkpoint or tokenizer folder's files other than weights (configs,
  tokenizer files, custom code); '' for no folder."""
  if not path or not os.path.isdir(path):
    return ""
  h = hashlib.sha256()
  for root, dirs, names in os.walk(path):
    dirs.sort()
    for name in sorted(names):
      if name.endswith(_WEIGHT_SUFFIXES):
        continue
      full = os.path.join(root, name)
      h.update(os.path.relpath(full, path).encode())
      h.update(_file_hash(full).encode())
  return h.hexdigest()


def environment_fingerprint() -> str:
  """jax / jaxlib versions, the devices, XLA_FLAGS and the lowering-relevant JAX flags."""
  import jaxlib  # pylint: disable=import-outside-toplevel

  devices = [(d.id, d.platform, d.device_kind) for d in jax.devices()]
  flags = [(name, str(getattr(jax.config, name, None))) for name in _JAX_FLAGS]
  return repr(
    (
      FORMAT,
      jax.__version__,
      jaxlib.__version__,
      jax.default_backend(),
      devices,
      os.environ.get("XLA_FLAGS", ""),
      flags,
    )
  )


def fingerprint(config_text: str, folders: Sequence[str] = ()) -> str:
  """The run's part of every key: ``config_text`` (e.g. the config's JSON), the folders'
  non-weight files, the loaded source and the environment."""
  h = hashlib.sha256()
  for part in (
    config_text,
    *map(folder_fingerprint, folders),
    source_fingerprint(),
    environment_fingerprint(),
  ):
    h.update(part.encode())
    h.update(b"\0")
  return h.hexdigest()


def describe_sharding(sharding) -> tuple:
  """A stable description of a sharding, device ids in mesh order included."""
  memory = getattr(sharding, "memory_kind", None)
  if isinstance(sharding, jax.sharding.NamedSharding):
    mesh = sharding.mesh
    return (
      "named",
      tuple(mesh.axis_names),
      tuple(mesh.devices.shape),
      tuple(int(d.id) for d in mesh.devices.flat),
      str(sharding.spec),
      memory,
    )
  if isinstance(sharding, jax.sharding.SingleDeviceSharding):
    return ("single", int(next(iter(sharding.device_set)).id), memory)
  return (
    type(sharding).__name__,
    repr(sharding),
    tuple(sorted(int(d.id) for d in sharding.device_set)),
    memory,
  )


def leaf_key(x) -> tuple:
  """What a compiled program depends on in one argument leaf (for the in-memory table)."""
  if isinstance(x, jax.Array):
    return (
      "array",
      x.shape,
      x.dtype,
      getattr(x, "weak_type", False),
      x.sharding,
      getattr(x, "committed", True),
    )
  if isinstance(x, (np.ndarray, np.generic)):
    return ("numpy", x.shape, x.dtype)
  if isinstance(x, (bool, int, float, complex)):
    return ("python", type(x))
  raise TypeError(f"cannot key an argument of type {type(x).__name__}")


def leaf_text(k: tuple) -> str:
  if k[0] == "array":
    return repr(("array", k[1], str(k[2]), k[3], describe_sharding(k[4]), k[5]))
  if k[0] == "numpy":
    return repr(("numpy", k[1], str(k[2])))
  return repr(("python", k[1].__name__))


def describe(value: Any) -> str:
  """A stable text of a static value for a site's key: a mesh by its axes and device ids, a
  (tree of) shardings by :func:`describe_sharding`, anything else by its repr."""
  if isinstance(value, jax.sharding.Mesh):
    return repr(
      (
        "mesh",
        tuple(value.axis_names),
        tuple(value.devices.shape),
        tuple(int(d.id) for d in value.devices.flat),
      )
    )
  is_sharding = lambda x: isinstance(x, jax.sharding.Sharding)
  leaves, treedef = jax.tree.flatten(value, is_leaf=is_sharding)
  if any(map(is_sharding, leaves)):
    return repr(
      (str(treedef), [describe_sharding(x) if is_sharding(x) else repr(x) for x in leaves])
    )
  return repr(value)
