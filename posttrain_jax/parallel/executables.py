"""Compiled programs stored whole, so a rerun of a config skips tracing, lowering and compiling.

JAX's persistent compilation cache (:mod:`compile_cache`) saves only XLA's compile on a rerun:
its key is a hash of the lowered module, so every program is still traced to a jaxpr and lowered
to StableHLO before the cache is consulted. For the RL update and the sampler of the tiny
workload that is most of a warm start (tracing and lowering ~2.2 s of the 2.9 s a rerun spent
in compilation stages, scripts/bench.py; README "Speed"). This layer keys a program by what
determines it without tracing it and stores the compiled executable
(``jax.experimental.serialize_executable``) next to JAX's cache:

* the site: a name and the reprs of the static values its factory closes over (a
  ``SamplerConfig``, an ``RLLossConfig``, a mesh);
* the run's fingerprint (:func:`fingerprint`): the run's config, the non-weight files of the
  checkpoint or tokenizer folders it reads, and the environment: the source of every loaded
  module that is not an installed package (this project, an experiment file, a user's
  registered loss), the versions of jax and jaxlib, the devices, ``XLA_FLAGS`` and the JAX
  flags that change lowering;
* the arguments: tree structure, shapes, dtypes, weak types and shardings (device ids included).

A key that is not on disk is compiled as ``jax.jit`` would compile it (so JAX's persistent cache
may serve it) and written with the executable's original bytes: a fresh compile's own
serialization, or the bytes JAX's persistent cache read (XLA:CPU cannot serialize again an
executable it loaded or one that has run; see ``_raw_by_executable``). A file that cannot be read
is compiled afresh and rewritten; a program that cannot be serialized is compiled as usual each
run, with one warning; a loaded program whose first call fails is deleted and compiled afresh
(or, when it consumed donated arguments, the run stops with an error saying so, and a rerun
compiles it).

Each run fingerprint also has a manifest (``runs/<fingerprint>.json``): the keys of the programs
the run used, in the order it first used them. :meth:`ExecutableCache.prefetch` (the RL loop calls
it as its first iteration starts) loads them in a background thread, so that on a rerun the
update is loaded while the sampler loads, runs and its texts are scored, not after; a program
whose load is still in flight when it is first called waits for it.

Limits: a change none of the above sees (editing an installed package, patching a function at
run time) would load a stale program. ``config.executable_cache = False`` or the environment
variable ``POSTTRAIN_JAX_EXECUTABLE_CACHE=0`` turns the layer off (:func:`disable_in_this_process`
for one process: the test session, which patches functions; its subprocess runs keep it on);
deleting ``<compilation cache>/executables`` clears it. With several processes it is
off (every process would have to load the same executable).
"""

import atexit
import concurrent.futures
import hashlib
import io
import json
import logging
import os
import pickle
import sys
import sysconfig
import tempfile
import threading
import time
import weakref
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.experimental import serialize_executable

ENV = "POSTTRAIN_JAX_EXECUTABLE_CACHE"
SUBDIR = "executables"
PREFETCH_ENV = "POSTTRAIN_JAX_PREFETCH"
FORMAT = 1  # bump when the stored layout or the key's contents change
# JAX flags whose values change what a traced function lowers to.
_JAX_FLAGS = ("jax_enable_x64", "jax_default_matmul_precision", "jax_numpy_rank_promotion",
              "jax_numpy_dtype_promotion", "jax_default_prng_impl", "jax_threefry_partitionable")
# Checkpoint and tokenizer folders: every file but the weights enters the fingerprint.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".msgpack", ".h5", ".npz", ".gguf")

_log = logging.getLogger(__name__)
_source_hashes: dict[str, tuple[float, int, str]] = {}  # path -> (mtime, size, sha256)
_lock = threading.Lock()
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_events = threading.local()  # this thread's counts: backend compiles, persistent-cache hits


def _count_hit(event: str, **_) -> None:
  if event == _CACHE_HIT_EVENT:
    _events.hits = getattr(_events, "hits", 0) + 1


def _count_compile(event: str, duration: float, **_) -> None:
  del duration
  if event == _COMPILE_EVENT:
    _events.compiles = getattr(_events, "compiles", 0) + 1


def _counts() -> tuple[int, int]:
  return getattr(_events, "compiles", 0), getattr(_events, "hits", 0)


jax.monitoring.register_event_listener(_count_hit)
jax.monitoring.register_event_duration_secs_listener(_count_compile)

# The bytes behind an executable: XLA:CPU cannot serialize again an executable it loaded (the
# copy lacks its kernels and fails when reloaded: "Function ... not found") nor one that has
# run (its sort comparators), but the bytes it was made from are a valid serialization. They
# are the fresh compile's own serialization, or the ones JAX's persistent cache read (captured
# by wrapping its reader, a JAX internal: without it such programs are simply not stored), and
# are remembered per executable for the compiles JAX's in-memory cache serves again.
_raw_by_executable: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _capture_cache_reads() -> bool:
  try:
    from jax._src import compilation_cache  # pylint: disable=import-outside-toplevel
    read = compilation_cache.extract_executable_and_time
  except (ImportError, AttributeError):
    return False
  if getattr(read, "_posttrain_capture", False):
    return True

  def extract_and_keep(executable_and_time):
    serialized, compile_time = read(executable_and_time)
    _events.served = serialized
    return serialized, compile_time

  extract_and_keep._posttrain_capture = True  # type: ignore[attr-defined]
  compilation_cache.extract_executable_and_time = extract_and_keep
  return True


_CAPTURES = _capture_cache_reads()
_Pickler = None  # built on first use (_make_pickler)


def _make_pickler():
  """``serialize_executable``'s pickler, with the executable's bytes given (``raw``) or taken
  from a fresh executable and kept in ``.raw`` (JAX internals: a JAX without them raises,
  and programs are then compiled as usual, with one warning)."""
  from jax._src.lib import _jax  # pylint: disable=import-outside-toplevel
  from jax._src.lib import xla_client  # pylint: disable=import-outside-toplevel
  executable_types = (xla_client.LoadedExecutable, _jax.Executable)

  class Pickler(serialize_executable._JaxPjrtPickler):  # pylint: disable=protected-access

    def __init__(self, file, raw: bytes | None):
      super().__init__(file)
      self.raw = raw

    def persistent_id(self, obj):
      if self.raw is not None and isinstance(obj, executable_types):
        return ("exec", self.raw)     # (serializing it again might fail or lose its kernels)
      pid = super().persistent_id(obj)
      if pid is not None and pid[0] == "exec":
        self.raw = pid[1]
      return pid

  return Pickler


def _serialize(compiled, raw: bytes | None) -> tuple[bytes, Any, Any, bytes]:
  """``serialize_executable.serialize(compiled)`` with the executable's bytes ``raw`` (None:
  serialize it, which only a fresh, never-run executable allows); also returns the bytes."""
  global _Pickler  # pylint: disable=global-statement
  if _Pickler is None:
    _Pickler = _make_pickler()
  unloaded = getattr(compiled._executable, "_unloaded_executable", None)  # pylint: disable=protected-access
  if unloaded is None:
    raise ValueError("this executable does not support serialization")
  args_info_flat, in_tree = jax.tree_util.tree_flatten(compiled.args_info)
  if compiled._params.const_args:  # pylint: disable=protected-access
    raise ValueError("the program closes over constants (const_args)")
  with io.BytesIO() as f:
    pickler = _Pickler(f, raw)
    pickler.dump((unloaded, args_info_flat, compiled._no_kwargs))  # pylint: disable=protected-access
    return f.getvalue(), in_tree, compiled.out_tree, pickler.raw


_this_process = {"enabled": True}


def disable_in_this_process() -> None:
  """Turns the layer off in this process only; processes it starts keep their default (a test
  session that patches library functions at run time, whose subprocess runs do not)."""
  _this_process["enabled"] = False


def enabled(configured: bool = True) -> bool:
  """Whether runs store and load executables: ``configured`` (``config.executable_cache``),
  not turned off by the environment or :func:`disable_in_this_process`, one process, and
  JAX's persistent cache on."""
  if (not configured or not _this_process["enabled"]
      or os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off")):
    return False
  return jax.process_count() == 1 and bool(jax.config.jax_compilation_cache_dir)


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
  return repr((FORMAT, jax.__version__, jaxlib.__version__, jax.default_backend(), devices,
               os.environ.get("XLA_FLAGS", ""), flags))


def fingerprint(config_text: str, folders: Sequence[str] = ()) -> str:
  """The run's part of every key: ``config_text`` (e.g. the config's JSON), the folders'
  non-weight files, the loaded source and the environment."""
  h = hashlib.sha256()
  for part in (config_text, *map(folder_fingerprint, folders), source_fingerprint(),
               environment_fingerprint()):
    h.update(part.encode())
    h.update(b"\0")
  return h.hexdigest()


def describe_sharding(sharding) -> tuple:
  """A stable description of a sharding, device ids in mesh order included."""
  memory = getattr(sharding, "memory_kind", None)
  if isinstance(sharding, jax.sharding.NamedSharding):
    mesh = sharding.mesh
    return ("named", tuple(mesh.axis_names), tuple(mesh.devices.shape),
            tuple(int(d.id) for d in mesh.devices.flat), str(sharding.spec), memory)
  if isinstance(sharding, jax.sharding.SingleDeviceSharding):
    return ("single", int(next(iter(sharding.device_set)).id), memory)
  return (type(sharding).__name__, repr(sharding),
          tuple(sorted(int(d.id) for d in sharding.device_set)), memory)


def _leaf_key(x) -> tuple:
  """What a compiled program depends on in one argument leaf (for the in-memory table)."""
  if isinstance(x, jax.Array):
    return ("array", x.shape, x.dtype, getattr(x, "weak_type", False), x.sharding,
            getattr(x, "committed", True))
  if isinstance(x, (np.ndarray, np.generic)):
    return ("numpy", x.shape, x.dtype)
  if isinstance(x, (bool, int, float, complex)):
    return ("python", type(x))
  raise TypeError(f"cannot key an argument of type {type(x).__name__}")


def _leaf_text(k: tuple) -> str:
  if k[0] == "array":
    return repr(("array", k[1], str(k[2]), k[3], describe_sharding(k[4]), k[5]))
  if k[0] == "numpy":
    return repr(("numpy", k[1], str(k[2])))
  return repr(("python", k[1].__name__))


class Program:
  """A ``jax.jit``-like callable (positional arguments only) whose compiled executables come
  from and go to an :class:`ExecutableCache`, one per argument signature."""

  def __init__(self, fun: Callable, cache: "ExecutableCache", name: str, static: tuple,
               jit_kwargs: dict):
    self.jitted = jax.jit(fun, **jit_kwargs)
    self._cache, self.name = cache, name
    self._site = repr((name, tuple(map(describe, static)),
                       sorted((k, describe(v)) for k, v in jit_kwargs.items())))
    self._programs: dict = {}

  def __call__(self, *args):
    leaves, treedef = jax.tree.flatten(args)
    try:
      sig = (treedef, tuple(map(_leaf_key, leaves)))
    except TypeError:  # an argument this layer does not key: plain jit
      return self.jitted(*args)
    compiled = self._programs.get(sig)
    if compiled is not None:
      return compiled(*args)
    compiled, loaded = self._cache.load_or_compile(self, sig, args)
    self._programs[sig] = compiled
    if not loaded:
      return compiled(*args)
    try:  # a loaded program's first call is awaited: its errors surface here, not later
      return jax.block_until_ready(compiled(*args))
    except jax.errors.JaxRuntimeError as e:
      self._cache.discard(self, sig, e)
      if any(isinstance(x, jax.Array) and x.is_deleted() for x in leaves):
        raise RuntimeError(
            f"the stored executable of {self.name!r} failed on its first call ({e}); its "
            "donated arguments are gone, so this run cannot go on. The file was deleted: "
            "rerunning compiles the program afresh (config.executable_cache=False or "
            f"{ENV}=0 turns stored programs off)") from e
      compiled = self._programs[sig] = self.jitted.lower(*args).compile()
      return compiled(*args)

  def lower(self, *args, **kwargs):
    return self.jitted.lower(*args, **kwargs)

  def key(self, sig) -> str:
    treedef, leaves = sig
    h = hashlib.sha256()
    for part in (self._cache.run_fingerprint, self._site, str(treedef),
                 *map(_leaf_text, leaves)):
      h.update(part.encode())
      h.update(b"\0")
    return h.hexdigest()


class ExecutableCache:
  """Serialized executables under ``directory``, for one run (``run_fingerprint``).

  ``stats`` counts programs ``loaded``, ``compiled`` (by XLA, this run), ``cache_served`` (by
  one of JAX's caches), ``stored``, ``unserializable``, and ``errors`` (files that could not be
  read, written or run), and the seconds spent loading (``load_s``) and storing (``store_s``)."""

  def __init__(self, directory: str, run_fingerprint: str):
    self.directory = directory
    self.run_fingerprint = run_fingerprint
    self.stats = {"loaded": 0, "compiled": 0, "cache_served": 0, "stored": 0,
                  "unserializable": 0, "errors": 0, "prefetched": 0, "load_s": 0.0,
                  "store_s": 0.0}
    self._warned: set[str] = set()
    self._lock = threading.Lock()
    # key -> the prefetch's Future of its executable (None once a caller has claimed the key).
    self._claims: dict[str, concurrent.futures.Future | None] = {}
    self._manifest: list[str] | None = None
    self._prefetch_started = False

  def jit(self, fun: Callable, *, name: str, static: tuple = (), **jit_kwargs) -> Callable:
    """A :class:`Program` of ``fun``; a plain ``jax.jit`` when static arguments are asked for
    (their values would have to enter the key; the sites pass static values in ``static``)."""
    if jit_kwargs.get("static_argnums") is not None or jit_kwargs.get("static_argnames"):
      return jax.jit(fun, **jit_kwargs)
    return Program(fun, self, name, static, jit_kwargs)

  def path(self, key: str) -> str:
    return os.path.join(self.directory, key[:2], key + ".exe")

  def load_or_compile(self, program: Program, sig, args):
    """``(executable, loaded)``: the stored executable of ``program`` for ``sig``, else a
    compile (which one of JAX's caches may serve), stored with the bytes it was made from.
    Without known bytes (JAX's internals changed, or an in-memory hit of an executable this
    layer never saw) it is not stored (``cache_served``)."""
    key = program.key(sig)
    path = self.path(key)
    prefetched = self._claim(key)
    if prefetched is not None and prefetched.result() is not None:
      self.stats["loaded"] += 1
      self.stats["prefetched"] += 1
      return prefetched.result(), True
    if os.path.exists(path):
      try:
        t = time.perf_counter()
        compiled = self._load(path)
        with self._lock:
          self.stats["load_s"] += time.perf_counter() - t
        self.stats["loaded"] += 1
        self._note(key)
        return compiled, True
      except Exception as e:  # pylint: disable=broad-except
        self.stats["errors"] += 1
        _log.warning("could not load the stored executable %s (%s: %s); compiling it afresh",
                     path, type(e).__name__, e)
    compiles, hits = _counts()
    _events.served = None
    compiled = program.jitted.lower(*args).compile()
    after = _counts()
    if after[1] > hits:                    # JAX's persistent cache served it
      raw = _events.served
    elif after[0] == compiles:             # JAX's in-memory cache served it (it may have run)
      raw = _raw_by_executable.get(compiled._executable)  # pylint: disable=protected-access
    else:                                  # a fresh compile: its own serialization
      raw = b""
    _events.served = None
    if raw is None:  # no valid bytes known for it: it is stored when next compiled for real
      self.stats["cache_served"] += 1
      return compiled, False
    self.stats["compiled" if raw == b"" else "cache_served"] += 1
    self._store(program, compiled, path, raw or None)
    return compiled, False

  def manifest_path(self) -> str:
    """The run's manifest: the keys of the programs it used, in first-use order."""
    fp = hashlib.sha256(self.run_fingerprint.encode()).hexdigest()
    return os.path.join(self.directory, "runs", fp[:2], fp + ".json")

  def manifest(self) -> list[str]:
    """The keys in the run's manifest (empty when there is none or it cannot be read)."""
    with self._lock:
      if self._manifest is None:
        try:
          with open(self.manifest_path()) as f:
            keys = json.load(f)["keys"]
          self._manifest = [k for k in keys if isinstance(k, str)]
        except (OSError, ValueError, KeyError, TypeError):
          self._manifest = []
      return list(self._manifest)

  def _note(self, key: str) -> None:
    """Adds ``key`` (a program this run has stored or loaded) to the run's manifest."""
    keys = self.manifest()
    if key in keys:
      return
    with self._lock:
      self._manifest.append(key)
      keys = list(self._manifest)
    path = self.manifest_path()
    try:
      _replace_file(path, json.dumps({"format": FORMAT, "keys": keys}).encode())
    except OSError as e:
      _log.warning("could not write the run's program manifest %s (%s)", path, e)

  def prefetch(self) -> bool:
    """Starts loading the programs in the run's manifest in a background thread (once per
    cache; later calls do nothing). A program first called while its load is in flight waits
    for it; one the thread could not load is loaded or compiled as usual by its caller.
    Returns whether a thread was started. ``POSTTRAIN_JAX_PREFETCH=0`` turns it off (each
    program is then loaded when first called)."""
    if os.environ.get(PREFETCH_ENV, "1").strip() == "0":
      return False
    with self._lock:
      if self._prefetch_started:
        return False
      self._prefetch_started = True
    keys = self.manifest()
    with self._lock:
      todo = [k for k in keys if k not in self._claims and os.path.exists(self.path(k))]
      futures = {k: concurrent.futures.Future() for k in todo}
      self._claims.update(futures)
    if not futures:
      return False
    thread = threading.Thread(target=self._load_all, args=(futures,), daemon=True,
                              name="posttrain_jax-prefetch")
    _prefetching.add(thread)
    thread.start()
    return True

  def _load_all(self, futures: dict) -> None:
    for key, future in futures.items():
      try:
        t = time.perf_counter()
        compiled = self._load(self.path(key))
        with self._lock:
          self.stats["load_s"] += time.perf_counter() - t
      except Exception as e:  # pylint: disable=broad-except
        _log.info("prefetch: could not load %s (%s: %s)", key, type(e).__name__, e)
        compiled = None
      future.set_result(compiled)

  def _claim(self, key: str) -> concurrent.futures.Future | None:
    """The prefetch's Future for ``key`` if it has one, the first time it is asked; the key is
    then claimed (a prefetch started later skips it)."""
    with self._lock:
      future = self._claims.get(key)
      self._claims[key] = None
    return future

  def discard(self, program: Program, sig, error: Exception) -> None:
    """Deletes the stored executable of ``program`` for ``sig`` that failed on its first call."""
    self.stats["errors"] += 1
    path = self.path(program.key(sig))
    _log.warning("the stored executable %s of %r failed on its first call (%s); compiling it "
                 "afresh", path, program.name, str(error).splitlines()[0])
    try:
      os.remove(path)
    except OSError:
      pass

  def _load(self, path: str):
    with open(path, "rb") as f:
      stored = pickle.load(f)
    if stored.get("format") != FORMAT:
      raise ValueError(f"format {stored.get('format')} is not {FORMAT}")
    by_id = {d.id: d for d in jax.devices()}
    devices = [by_id[i] for i in stored["devices"]]
    return serialize_executable.deserialize_and_load(
        stored["executable"], stored["in_tree"], stored["out_tree"],
        backend=devices[0].client, execution_devices=devices)

  def _store(self, program: Program, compiled, path: str, raw: bytes | None) -> None:
    """Writes ``compiled`` (with its executable's bytes ``raw``; None: serialized afresh)."""
    t = time.perf_counter()
    try:
      self._write(program, compiled, path, raw)
    finally:
      self.stats["store_s"] += time.perf_counter() - t

  def _write(self, program: Program, compiled, path: str, raw: bytes | None) -> None:
    try:
      blob, in_tree, out_tree, raw = _serialize(compiled, raw)
      _raw_by_executable[compiled._executable] = raw  # pylint: disable=protected-access
      devices = [int(d.id) for d in compiled.runtime_executable().local_devices()]
      data = pickle.dumps({"format": FORMAT, "executable": blob, "in_tree": in_tree,
                           "out_tree": out_tree, "devices": devices})
    except Exception as e:  # pylint: disable=broad-except
      self.stats["unserializable"] += 1
      if program.name not in self._warned:
        self._warned.add(program.name)
        _log.warning("the program %r cannot be stored (%s: %s); it is compiled every run",
                     program.name, type(e).__name__, e)
      return
    try:
      _replace_file(path, data)
      self.stats["stored"] += 1
      self._note(os.path.basename(path)[:-len(".exe")])
    except OSError as e:
      self.stats["errors"] += 1
      _log.warning("could not write the executable %s (%s)", path, e)


def _replace_file(path: str, data: bytes) -> None:
  """Writes ``data`` to ``path`` atomically (a temporary file in its folder, then a rename), so
  a reader, or a run killed mid-write, never sees half a file."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
  with os.fdopen(fd, "wb") as f:
    f.write(data)
  os.replace(tmp, path)


_prefetching: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()


@atexit.register
def _join_prefetches() -> None:
  """Lets a prefetch finish loading before the interpreter tears JAX down under it."""
  for thread in list(_prefetching):
    thread.join(timeout=60)


def for_run(config_text: str, folders: Sequence[str] = (), *, configured: bool = True,
            directory: str | None = None) -> ExecutableCache | None:
  """The run's cache under ``<JAX's compilation cache>/executables`` (or ``directory``), or
  None when :func:`enabled` says no."""
  if directory is None:
    if not enabled(configured):
      return None
    directory = os.path.join(jax.config.jax_compilation_cache_dir, SUBDIR)
  return ExecutableCache(directory, fingerprint(config_text, folders))


_installed: dict[str, ExecutableCache | None] = {"store": None}


def install(store: ExecutableCache | None) -> None:
  """Makes ``store`` the one every :func:`jit` site of this process goes through (None: plain
  ``jax.jit``). Entry points that want stored programs (main, benchmarks) call it."""
  _installed["store"] = store


def installed() -> ExecutableCache | None:
  """The store :func:`install` set, or None."""
  return _installed["store"]


def prefetch() -> bool:
  """Starts loading the installed store's manifest of programs in the background (a no-op
  without a store); see :meth:`ExecutableCache.prefetch`."""
  store = installed()
  return bool(store is not None and store.prefetch())


def jit(fun: Callable, *, name: str, static: tuple = (), cache: ExecutableCache | None = None,
        **jit_kwargs) -> Callable:
  """``jax.jit(fun, **jit_kwargs)``, through ``cache`` (default: the installed store) when
  there is one. ``name`` and ``static`` (the reprs of what ``fun`` closes over beyond the run's
  config) key the stored program."""
  cache = cache if cache is not None else installed()
  if cache is None:
    return jax.jit(fun, **jit_kwargs)
  return cache.jit(fun, name=name, static=static, **jit_kwargs)


def describe(value: Any) -> str:
  """A stable text of a static value for a site's key: a mesh by its axes and device ids, a
  (tree of) shardings by :func:`describe_sharding`, anything else by its repr."""
  if isinstance(value, jax.sharding.Mesh):
    return repr(("mesh", tuple(value.axis_names), tuple(value.devices.shape),
                 tuple(int(d.id) for d in value.devices.flat)))
  is_sharding = lambda x: isinstance(x, jax.sharding.Sharding)
  leaves, treedef = jax.tree.flatten(value, is_leaf=is_sharding)
  if any(map(is_sharding, leaves)):
    return repr((str(treedef), [describe_sharding(x) if is_sharding(x) else repr(x)
                                for x in leaves]))
  return repr(value)
