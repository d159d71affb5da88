"""Compiled programs stored whole, so a rerun of a config skips tracing, lowering and compiling.

JAX's persistent compilation cache (:mod:`compile_cache`) saves only XLA's compile on a rerun:
its key is a hash of the lowered module, so every program is still traced to a jaxpr and lowered
to StableHLO before the cache is consulted; for a small model that is most of a warm start
(README "Speed"). This layer keys a program by what determines it without tracing it
(:mod:`executable_keys`) and stores the compiled executable
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
executable it loaded or one that has run; see :mod:`jax_internals`). A file that cannot be read
is compiled afresh and rewritten; a program that cannot be serialized is compiled as usual each
run, with one warning; a loaded program whose first call fails is deleted and compiled afresh
(or, when it consumed donated arguments, the run stops with an error saying so, and a rerun
compiles it).

Each run fingerprint also has a manifest (``runs/<fingerprint>.json``): the keys of the programs
the run used, in the order it first used them. :meth:`ExecutableCache.prefetch` (the RL loop calls
it as its first iteration starts) loads them in a background thread, so that on a rerun the
update is loaded while the sampler loads, runs and its texts are scored, not after; a program
whose load is still in flight when it is first called waits for it.

The layer is opt-in and explicit: importing this module changes nothing in JAX. An entry point
that wants stored programs builds a store (:func:`for_run`) and calls :func:`install`, which
activates the adapters of :mod:`jax_internals` (JAX internals: two monitoring listeners and a
wrapped persistent-cache reader; with one of them missing it warns once and installs nothing).
Call sites use :func:`jit`: the installed store's :class:`Program`, else plain ``jax.jit``.
:func:`prefetch` starts the installed store's prefetch (nothing without one).

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
import json
import logging
import os
import pickle
import tempfile
import threading
import time
import weakref
from typing import Any, Callable, Sequence

import jax
from jax.experimental import serialize_executable

from posttrain_jax.parallel import jax_internals

# (the key's parts, re-exported: tests and callers name them executables.X)
from posttrain_jax.parallel.executable_keys import (
  FORMAT,
  describe,
  fingerprint,
  leaf_key,
  leaf_text,
)
from posttrain_jax.parallel.executable_keys import describe_sharding as describe_sharding
from posttrain_jax.parallel.executable_keys import (
  environment_fingerprint as environment_fingerprint,
)
from posttrain_jax.parallel.executable_keys import folder_fingerprint as folder_fingerprint
from posttrain_jax.parallel.executable_keys import source_fingerprint as source_fingerprint

ENV = "POSTTRAIN_JAX_EXECUTABLE_CACHE"
SUBDIR = "executables"
PREFETCH_ENV = "POSTTRAIN_JAX_PREFETCH"

_log = logging.getLogger(__name__)
_this_process = {"enabled": True}


def disable_in_this_process() -> None:
  """Turns the layer off in this process only; processes it starts keep their default (a test
  session that patches library functions at run time, whose subprocess runs do not)."""
  _this_process["enabled"] = False


def enabled(configured: bool = True, cache_dir: str | None = None) -> bool:
  """Whether runs store and load executables: ``configured`` (``config.executable_cache``),
  not turned off by the environment or :func:`disable_in_this_process`, one process, and
  JAX's persistent cache on (``cache_dir``: the folder the run will give it; default the one
  JAX has now)."""
  if (
    not configured
    or not _this_process["enabled"]
    or os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off")
  ):
    return False
  return bool(cache_dir or jax.config.jax_compilation_cache_dir) and jax.process_count() == 1


class Program:
  """A ``jax.jit``-like callable (positional arguments only) whose compiled executables come
  from and go to an :class:`ExecutableCache`, one per argument signature."""

  def __init__(
    self, fun: Callable, cache: "ExecutableCache", name: str, static: tuple, jit_kwargs: dict
  ):
    self.jitted = jax.jit(fun, **jit_kwargs)
    self._cache, self.name = cache, name
    self._site = repr(
      (name, tuple(map(describe, static)), sorted((k, describe(v)) for k, v in jit_kwargs.items()))
    )
    self._programs: dict = {}

  def __call__(self, *args):
    leaves, treedef = jax.tree.flatten(args)
    try:
      sig = (treedef, tuple(map(leaf_key, leaves)))
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
          f"{ENV}=0 turns stored programs off)"
        ) from e
      compiled = self._programs[sig] = self.jitted.lower(*args).compile()
      return compiled(*args)

  def lower(self, *args, **kwargs):
    return self.jitted.lower(*args, **kwargs)

  def key(self, sig) -> str:
    treedef, leaves = sig
    h = hashlib.sha256()
    for part in (self._cache.run_fingerprint, self._site, str(treedef), *map(leaf_text, leaves)):
      h.update(part.encode())
      h.update(b"\0")
    return h.hexdigest()


class ExecutableCache:
  """Serialized executables under ``directory``, for one run (``run_fingerprint``: its text, or
  a function computing it when the first program is keyed, see :func:`for_run`). Its programs
  are stored only while the layer is installed (:func:`install`); otherwise :meth:`jit` is a
  plain ``jax.jit``.

  ``stats`` counts programs ``loaded``, ``compiled`` (by XLA, this run), ``cache_served`` (by
  one of JAX's caches), ``stored``, ``unserializable``, and ``errors`` (files that could not be
  read, written or run), and the seconds spent loading (``load_s``) and storing (``store_s``)."""

  def __init__(self, directory: str, run_fingerprint: str | Callable[[], str]):
    self.directory = directory
    self._fingerprint = run_fingerprint
    self.stats = {
      "loaded": 0,
      "compiled": 0,
      "cache_served": 0,
      "stored": 0,
      "unserializable": 0,
      "errors": 0,
      "prefetched": 0,
      "load_s": 0.0,
      "store_s": 0.0,
    }
    self._warned: set[str] = set()
    self._lock = threading.Lock()
    self._fingerprint_lock = threading.Lock()
    # key -> the prefetch's Future of its executable (None once a caller has claimed the key).
    self._claims: dict[str, concurrent.futures.Future | None] = {}
    self._manifest: list[str] | None = None
    self._prefetch_started = False

  @property
  def run_fingerprint(self) -> str:
    with self._fingerprint_lock:
      if callable(self._fingerprint):
        self._fingerprint = self._fingerprint()
      return self._fingerprint

  def jit(self, fun: Callable, *, name: str, static: tuple = (), **jit_kwargs) -> Callable:
    """A :class:`Program` of ``fun``; a plain ``jax.jit`` when static arguments are asked for
    (their values would have to enter the key; the sites pass static values in ``static``) or
    the layer is not installed."""
    if (
      jit_kwargs.get("static_argnums") is not None
      or jit_kwargs.get("static_argnames")
      or not jax_internals.active()
    ):
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
        _log.warning(
          "could not load the stored executable %s (%s: %s); compiling it afresh",
          path,
          type(e).__name__,
          e,
        )
    if not jax_internals.active():  # uninstalled since: compiled, not stored
      return program.jitted.lower(*args).compile(), False
    compiles, hits = jax_internals.counts()
    jax_internals.take_served()
    compiled = program.jitted.lower(*args).compile()
    after = jax_internals.counts()
    served = jax_internals.take_served()
    if after[1] > hits:  # JAX's persistent cache served it
      raw = served
    elif after[0] == compiles:  # JAX's in-memory cache served it (it may have run)
      raw = jax_internals.raw_by_executable.get(jax_internals.executable_of(compiled))
    else:  # a fresh compile: its own serialization
      raw = b""
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
    thread = threading.Thread(
      target=self._load_all, args=(futures,), daemon=True, name="posttrain_jax-prefetch"
    )
    _prefetching.add(thread)
    if not _join_registered:
      _join_registered.append(atexit.register(_join_prefetches))
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
    _log.warning(
      "the stored executable %s of %r failed on its first call (%s); compiling it afresh",
      path,
      program.name,
      str(error).splitlines()[0],
    )
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
      stored["executable"],
      stored["in_tree"],
      stored["out_tree"],
      backend=devices[0].client,
      execution_devices=devices,
    )

  def _store(self, program: Program, compiled, path: str, raw: bytes | None) -> None:
    """Writes ``compiled`` (with its executable's bytes ``raw``; None: serialized afresh)."""
    t = time.perf_counter()
    try:
      self._write(program, compiled, path, raw)
    finally:
      self.stats["store_s"] += time.perf_counter() - t

  def _write(self, program: Program, compiled, path: str, raw: bytes | None) -> None:
    try:
      blob, in_tree, out_tree, raw = jax_internals.serialize(compiled, raw)
      jax_internals.raw_by_executable[jax_internals.executable_of(compiled)] = raw
      devices = [int(d.id) for d in compiled.runtime_executable().local_devices()]
      data = pickle.dumps(
        {
          "format": FORMAT,
          "executable": blob,
          "in_tree": in_tree,
          "out_tree": out_tree,
          "devices": devices,
        }
      )
    except Exception as e:  # pylint: disable=broad-except
      self.stats["unserializable"] += 1
      if program.name not in self._warned:
        self._warned.add(program.name)
        _log.warning(
          "the program %r cannot be stored (%s: %s); it is compiled every run",
          program.name,
          type(e).__name__,
          e,
        )
      return
    try:
      _replace_file(path, data)
      self.stats["stored"] += 1
      self._note(os.path.basename(path)[: -len(".exe")])
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
_join_registered: list = []


def _join_prefetches() -> None:
  """Lets a prefetch finish loading before the interpreter tears JAX down under it (registered
  with atexit when the first prefetch starts)."""
  for thread in list(_prefetching):
    thread.join(timeout=60)


def for_run(
  config_text: str,
  folders: Sequence[str] = (),
  *,
  configured: bool = True,
  directory: str | None = None,
  cache_dir: str | None = None,
) -> ExecutableCache | None:
  """The run's store under ``<cache_dir>/executables`` (``cache_dir``: JAX's compilation cache
  folder the run uses, default the one JAX has now) or under ``directory``; None when
  :func:`enabled` says no. The run's fingerprint (:func:`fingerprint` of ``config_text`` and
  ``folders``) is computed when the first program is keyed, so an entry point can build the
  store before the run writes its tokenizer folder or imports its environment's modules."""
  if directory is None:
    cache_dir = cache_dir or jax.config.jax_compilation_cache_dir
    if not enabled(configured, cache_dir):
      return None
    directory = os.path.join(cache_dir, SUBDIR)
  folders = tuple(folders)
  return ExecutableCache(directory, lambda: fingerprint(config_text, folders))


_installed: dict[str, Any] = {"store": None, "warned": False}


def install(store: ExecutableCache | None) -> ExecutableCache | None:
  """Makes ``store`` the one every :func:`jit` site of this process goes through, activating
  the JAX adapters it needs (:func:`jax_internals.activate`; idempotent). None uninstalls:
  plain ``jax.jit`` again, JAX's reader and listeners restored. Entry points that want stored
  programs (main, the benchmarks) call it before building their jitted functions. A JAX that
  lacks one of the private APIs used gets one warning and no store. Returns the store now
  installed (None when none)."""
  if store is None:
    _installed["store"] = None
    jax_internals.deactivate()
    return None
  gone = jax_internals.activate()
  if gone:
    if not _installed["warned"]:
      _installed["warned"] = True
      _log.warning(
        "stored compiled programs are off: parallel/executables.py relies on %s, "
        "which this JAX (%s) no longer has; %s",
        ", ".join(gone),
        jax.__version__,
        jax_internals.HINT,
      )
    return None
  _installed["store"] = store
  return store


def installed() -> ExecutableCache | None:
  """The store :func:`install` set, or None."""
  return _installed["store"]


def prefetch() -> bool:
  """Starts loading the installed store's manifest in the background
  (:meth:`ExecutableCache.prefetch`; the RL loop calls it as its first iteration starts).
  Returns whether a thread started; False without a store."""
  store = installed()
  return store is not None and store.prefetch()


def stats() -> dict | None:
  """A copy of the installed store's counts (:attr:`ExecutableCache.stats`), or None."""
  store = installed()
  return None if store is None else dict(store.stats)


def jit(fun: Callable, *, name: str, static: tuple = (), **jit_kwargs) -> Callable:
  """``jax.jit(fun, **jit_kwargs)``, through the installed store when there is one. ``name``
  and ``static`` (the reprs of what ``fun`` closes over beyond the run's config) key the stored
  program."""
  cache = installed()
  if cache is None:
    return jax.jit(fun, **jit_kwargs)
  return cache.jit(fun, name=name, static=static, **jit_kwargs)
