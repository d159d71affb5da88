"""The JAX internals stored whole programs (parallel/executables.py) rely on, adapted in one place.

Nothing here touches JAX when imported. :func:`activate` (called by ``executables.install``)
registers two monitoring listeners (which compiles XLA ran, which JAX's persistent cache served)
and wraps JAX's persistent-cache reader so the bytes it read are kept: XLA:CPU cannot serialize
again an executable it loaded or one that has run, but the bytes it was made from are a valid
serialization. :func:`deactivate` undoes both. :func:`serialize` is
``serialize_executable.serialize`` with those bytes given, built on private classes and
``Compiled`` attributes. :func:`missing` names every private API used, so that a JAX upgrade
that moves one turns the layer off with one warning (and fails
``tests/parallel/test_executables.py::test_private_jax_apis_exist``), not a run.
"""

import importlib
import inspect
import io
import threading
import weakref
from typing import Any

import jax

CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
HINT = (
  "update _capture_cache_reads / _make_pickler in posttrain_jax/parallel/"
  "jax_internals.py or set executable_cache=False"
)
# (module, attribute path) of every private API used; checked by missing().
MODULE_APIS = (
  ("jax._src.compilation_cache", "extract_executable_and_time"),  # _capture_cache_reads
  ("jax._src.lib", "_jax.Executable"),  # _make_pickler
  ("jax._src.lib", "xla_client.LoadedExecutable"),  # _make_pickler
  ("jax.experimental.serialize_executable", "_JaxPjrtPickler.persistent_id"),
  ("jax._src.dispatch", "BACKEND_COMPILE_EVENT"),  # COMPILE_EVENT
)
# Attributes serialize() reads of a ``jax.stages.Compiled``, of its ``_params`` and of its
# ``_executable`` (checked on the classes' slots and fields: missing() compiles nothing, since
# a process's first compile decides whether JAX's persistent cache is used at all).
COMPILED_APIS = (
  (
    "jax._src.stages",
    "Compiled",
    "__slots__",
    ("_executable", "_params", "_no_kwargs", "args_info", "out_tree"),
  ),
  ("jax._src.stages", "CompiledCallParams", "_fields", ("const_args",)),
  ("jax._src.interpreters.pxla", "MeshExecutable", "__slots__", ("_unloaded_executable",)),
)

_events = threading.local()  # this thread's counts: backend compiles, persistent-cache hits
_state: dict[str, Any] = {"active": False, "read": None, "pickler": None}
_lock = threading.Lock()
# The bytes behind each executable this layer stored, for the compiles JAX's in-memory cache
# serves again (after the executable has run, it no longer serializes).
raw_by_executable: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _resolve(obj, path: str):
  for part in path.split("."):
    obj = getattr(obj, part)
  return obj


def missing() -> list[str]:
  """Every private JAX API this module uses that this JAX lacks, as ``jax._src.X.Y`` names
  ([] when all are there)."""
  gone = []
  for module, path in MODULE_APIS:
    try:
      _resolve(importlib.import_module(module), path)
    except (ImportError, AttributeError):
      gone.append(f"{module}.{path}")
  try:
    from jax._src import dispatch  # pylint: disable=import-outside-toplevel

    if getattr(dispatch, "BACKEND_COMPILE_EVENT", COMPILE_EVENT) != COMPILE_EVENT:
      gone.append(f"the event {COMPILE_EVENT} (jax._src.dispatch.BACKEND_COMPILE_EVENT)")
    from jax._src import compiler  # pylint: disable=import-outside-toplevel

    if repr(CACHE_HIT_EVENT) not in inspect.getsource(compiler):
      gone.append(f"the event {CACHE_HIT_EVENT} (jax._src.compiler)")
  except (ImportError, OSError, TypeError):
    gone.append("jax._src.compiler / jax._src.dispatch")
  for module, cls, where, names in COMPILED_APIS:
    try:
      have = set(_resolve(importlib.import_module(module), f"{cls}.{where}"))
    except (ImportError, AttributeError, TypeError):
      have = set()
    gone += [f"{module}.{cls}.{name}" for name in names if name not in have]
  try:
    if not callable(getattr(jax.stages.Compiled, "runtime_executable", None)):
      gone.append("jax.stages.Compiled.runtime_executable")
  except AttributeError:
    gone.append("jax.stages.Compiled")
  return gone


def _count_hit(event: str, **_) -> None:
  if event == CACHE_HIT_EVENT:
    _events.hits = getattr(_events, "hits", 0) + 1


def _count_compile(event: str, duration: float, **_) -> None:
  del duration
  if event == COMPILE_EVENT:
    _events.compiles = getattr(_events, "compiles", 0) + 1


def counts() -> tuple[int, int]:
  """This thread's (backend compiles, persistent-cache hits) since :func:`activate`."""
  return getattr(_events, "compiles", 0), getattr(_events, "hits", 0)


def take_served() -> bytes | None:
  """The bytes JAX's persistent cache last read in this thread (then forgotten), or None."""
  served, _events.served = getattr(_events, "served", None), None
  return served


def _capture_cache_reads():
  """Wraps ``jax._src.compilation_cache.extract_executable_and_time`` so the executable bytes
  it returns are kept for :func:`take_served`; returns the original reader."""
  from jax._src import compilation_cache  # pylint: disable=import-outside-toplevel

  read = compilation_cache.extract_executable_and_time

  def extract_and_keep(executable_and_time):
    serialized, compile_time = read(executable_and_time)
    _events.served = serialized
    return serialized, compile_time

  compilation_cache.extract_executable_and_time = extract_and_keep
  return read


def active() -> bool:
  return _state["active"]


def activate() -> list[str]:
  """Registers the listeners and wraps the cache reader (once; idempotent). Returns the missing
  private APIs ([] on success); with any missing, nothing is changed."""
  with _lock:
    if _state["active"]:
      return []
    gone = missing()
    if gone:
      return gone
    _state["pickler"] = _state["pickler"] or _make_pickler()
    _state["read"] = _capture_cache_reads()
    jax.monitoring.register_event_listener(_count_hit)
    jax.monitoring.register_event_duration_secs_listener(_count_compile)
    _state["active"] = True
    return []


def deactivate() -> None:
  """Undoes :func:`activate`: JAX's reader restored, the listeners unregistered."""
  with _lock:
    if not _state["active"]:
      return
    from jax._src import compilation_cache  # pylint: disable=import-outside-toplevel

    compilation_cache.extract_executable_and_time = _state["read"]
    for name, listener in (
      ("unregister_event_listener", _count_hit),
      ("unregister_event_duration_listener", _count_compile),
    ):
      unregister = getattr(jax.monitoring, name, None)
      if unregister is not None:
        try:
          unregister(listener)
        except (AssertionError, ValueError, KeyError):
          pass
    _state.update(active=False, read=None)


def _make_pickler():
  """``serialize_executable``'s pickler, with the executable's bytes given (``raw``) or taken
  from a fresh executable and kept in ``.raw``."""
  from jax._src.lib import (
    _jax,  # pylint: disable=import-outside-toplevel
    xla_client,  # pylint: disable=import-outside-toplevel
  )
  from jax.experimental import serialize_executable  # pylint: disable=import-outside-toplevel

  executable_types = (xla_client.LoadedExecutable, _jax.Executable)

  class Pickler(serialize_executable._JaxPjrtPickler):  # pylint: disable=protected-access
    def __init__(self, file, raw: bytes | None):
      super().__init__(file)
      self.raw = raw

    def persistent_id(self, obj):
      if self.raw is not None and isinstance(obj, executable_types):
        return ("exec", self.raw)  # (serializing it again might fail or lose its kernels)
      pid = super().persistent_id(obj)
      if pid is not None and pid[0] == "exec":
        self.raw = pid[1]
      return pid

  return Pickler


def executable_of(compiled):
  """The object JAX's in-memory cache hands out again for the same program (the weak key of
  :data:`raw_by_executable`)."""
  return compiled._executable  # pylint: disable=protected-access


def serialize(compiled, raw: bytes | None) -> tuple[bytes, Any, Any, bytes]:
  """``serialize_executable.serialize(compiled)`` with the executable's bytes ``raw`` (None:
  serialize it, which only a fresh, never-run executable allows); also returns the bytes."""
  if _state["pickler"] is None:
    raise ValueError("the layer's JAX adapters are not active (executables.install)")
  unloaded = getattr(executable_of(compiled), "_unloaded_executable", None)
  if unloaded is None:
    raise ValueError("this executable does not support serialization")
  args_info_flat, in_tree = jax.tree_util.tree_flatten(compiled.args_info)
  if compiled._params.const_args:  # pylint: disable=protected-access
    raise ValueError("the program closes over constants (const_args)")
  with io.BytesIO() as f:
    pickler = _state["pickler"](f, raw)
    pickler.dump((unloaded, args_info_flat, compiled._no_kwargs))  # pylint: disable=protected-access
    return f.getvalue(), in_tree, compiled.out_tree, pickler.raw
