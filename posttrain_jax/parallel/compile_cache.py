"""JAX's persistent compilation cache for runs: a rerun of a config loads its programs from disk.

``config.compilation_cache_dir`` (default ``~/.cache/posttrain_jax/xla``; the environment
variable ``POSTTRAIN_JAX_COMPILATION_CACHE`` overrides it; '' turns it off) is set before the
first compilation. Every program is cached (minimum compile time 0), since a run compiles a
few large programs (the train step, the sampler) and a dozen small ones whose compile times add
up. A process that already configured a cache directory (tests, benchmarks) keeps its own.
"""

import os

import jax

DEFAULT_DIR = os.path.join("~", ".cache", "posttrain_jax", "xla")
ENV = "POSTTRAIN_JAX_COMPILATION_CACHE"


def resolve_dir(configured: str | None) -> str:
  """The cache directory a run uses: the environment's, else ``configured`` (None: the
  default), with ``~`` expanded; '' when turned off."""
  path = os.environ.get(ENV, DEFAULT_DIR if configured is None else configured)
  return os.path.expanduser(path) if path else ""


def enable(configured: str | None = None) -> str:
  """Points JAX's persistent compilation cache at :func:`resolve_dir` unless this process set
  one already; returns the directory in effect ('' when off)."""
  current = jax.config.jax_compilation_cache_dir
  if current:
    return current
  path = resolve_dir(configured)
  if not path:
    return ""
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise ValueError(
      f"cannot create the compilation cache directory {path!r} ({e}); set "
      "config.compilation_cache_dir to a writable folder, or '' to turn the "
      "cache off"
    ) from None
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path
