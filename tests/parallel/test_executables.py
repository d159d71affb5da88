"""Stored compiled programs (parallel/executables.py): a rerun loads them without tracing and
gets the same results; keys follow everything a program depends on; bad files are recovered
from; the layer touches JAX only while installed, and says which private JAX API moved. The
runs are fresh processes (executables_check.py), each with the test's JAX cache; the tests in
this process install the layer for their duration only (``layer``)."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posttrain_jax import defaults
from posttrain_jax.methods import validate
from posttrain_jax.parallel import executables, jax_internals
from posttrain_jax.train.validate import ConfigError

CHECK = os.path.join(os.path.dirname(__file__), "executables_check.py")


def _run(cache_dir, fingerprint, mode, *extra, ok=True):
  proc = subprocess.run(
    [sys.executable, CHECK, str(cache_dir), fingerprint, mode, *extra],
    capture_output=True,
    text=True,
    timeout=300,
  )
  if not ok:
    return proc
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _reference():
  """The check's step, twice, in numpy (float64): the values a run must give."""
  w = np.arange(12.0).reshape(4, 3) / 10
  x = np.asarray(jnp.asarray(np.random.default_rng(0).normal(size=(6, 4)), jnp.float32), np.float64)
  for _ in range(2):
    y = np.sort(x, axis=1) @ w
    w = w - 0.5 * y.mean()
  return w, y


def test_a_rerun_loads_the_program_untraced_with_the_same_results(tmp_path):
  w_ref, y_ref = _reference()
  first = _run(tmp_path, "run-a", "run")
  assert first["stats"]["compiled"] == 1 and first["stats"]["loaded"] == 0
  assert first["traced_step"] == 1 and first["files"] == 1
  second = _run(tmp_path, "run-a", "run")
  counts = lambda stats: {k: v for k, v in stats.items() if not k.endswith("_s")}
  assert counts(second["stats"]) == {
    **counts(first["stats"]),
    "compiled": 0,
    "stored": 0,
    "loaded": 1,
  }
  assert second["stats"]["load_s"] > 0 and first["stats"]["store_s"] > 0
  assert second["traced_step"] == 0  # neither traced nor lowered
  for out in (first, second):
    np.testing.assert_allclose(out["w"], w_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["y"], y_ref, rtol=1e-5, atol=1e-6)
    assert out["n"] == 2 and out["donated"]  # the state was donated, also when loaded
    assert out["y_devices"] == [2, 3] and out["y_spec"] == "P('data',)"
  assert second["w"] == first["w"] and second["y"] == first["y"]  # bit for bit
  # Another run fingerprint (e.g. an edited source file that changed no program): JAX's cache
  # serves the compile, and the program is stored with the bytes that cache read (XLA:CPU
  # cannot serialize the executable it loaded: the copy would lack its kernels), so the next
  # run of that fingerprint loads a program that works.
  edited = _run(tmp_path, "run-b", "run")
  assert edited["stats"]["cache_served"] == 1 and edited["stats"]["stored"] == 1
  assert edited["traced_step"] == 1 and edited["files"] == 2
  after_edit = _run(tmp_path, "run-b", "run")
  assert after_edit["stats"]["loaded"] == 1 and after_edit["traced_step"] == 0
  assert after_edit["w"] == first["w"] and after_edit["y"] == first["y"]
  # An executable that loads but fails on its first call (one re-serialized from JAX's cache,
  # which lacks its kernels) after consuming the donated state: a clear error, the file
  # deleted so that a rerun compiles it.
  proc = _run(tmp_path, "run-a", "poison", ok=False)
  assert proc.returncode != 0
  assert "failed on its first call" in proc.stderr and "rerunning compiles" in proc.stderr
  assert len(list((tmp_path / executables.SUBDIR).glob("*/*.exe"))) == 1  # run-b's


@pytest.fixture
def layer(tmp_path):
  """The layer installed (its JAX adapters active) for one test, uninstalled after it."""
  assert executables.install(executables.ExecutableCache(str(tmp_path / "installed"), "t"))
  yield
  executables.install(None)


@pytest.fixture
def jax_cache_everything():
  """JAX's persistent cache keeps even tiny programs (the suite keeps those over 1 s)."""
  before = jax.config.jax_persistent_cache_min_compile_time_secs
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  yield
  jax.config.update("jax_persistent_cache_min_compile_time_secs", before)


def test_a_compile_served_in_memory_is_stored_with_its_bytes(tmp_path, jax_cache_everything, layer):
  """A second run in one process (e.g. another seed) gets the first run's executable from JAX's
  in-memory cache, after it has run (it then no longer serializes: sort comparators): it is
  stored with the bytes remembered from the first store, and loads and runs."""
  salt = float(np.random.default_rng().integers(1 << 30))  # a program new to JAX's caches
  f = lambda x: jnp.sort(x) * salt
  x = jnp.arange(5.0)[::-1]
  first = executables.ExecutableCache(str(tmp_path), "seed-0")
  np.testing.assert_allclose(first.jit(f, name="f")(x), np.arange(5.0) * salt)
  assert first.stats["compiled"] == 1 and first.stats["stored"] == 1
  second = executables.ExecutableCache(str(tmp_path), "seed-1")
  np.testing.assert_allclose(second.jit(f, name="f")(x), np.arange(5.0) * salt)
  assert second.stats["cache_served"] == 1 and second.stats["stored"] == 1
  assert second.stats["unserializable"] == 0
  third = executables.ExecutableCache(str(tmp_path), "seed-1")
  np.testing.assert_allclose(third.jit(f, name="f")(x), np.arange(5.0) * salt)
  assert third.stats["loaded"] == 1


def test_a_junk_file_is_compiled_afresh_and_rewritten(tmp_path, layer):
  cache = executables.ExecutableCache(str(tmp_path), "run")
  f = lambda x: x * 2 + 1
  x = jnp.arange(4.0)
  program = cache.jit(f, name="f")
  path = cache.path(program.key(_sig(x)))
  os.makedirs(os.path.dirname(path))
  with open(path, "wb") as fh:
    fh.write(b"junk")
  np.testing.assert_allclose(program(x), [1, 3, 5, 7])
  assert cache.stats["errors"] == 1 and cache.stats["compiled"] == 1
  again = executables.ExecutableCache(str(tmp_path), "run")
  np.testing.assert_allclose(again.jit(f, name="f")(x), [1, 3, 5, 7])
  assert again.stats["loaded"] == 1 and again.stats["errors"] == 0


def test_a_loaded_program_failing_on_its_first_call_is_compiled_afresh(
  tmp_path, monkeypatch, layer
):
  cache = executables.ExecutableCache(str(tmp_path), "run")
  f = lambda x: x - 1
  x = jnp.arange(3.0)
  program = cache.jit(f, name="f")
  path = cache.path(program.key(_sig(x)))
  os.makedirs(os.path.dirname(path))
  open(path, "wb").close()

  class Broken:  # what a stored executable missing a kernel returns
    def block_until_ready(self):
      raise jax.errors.JaxRuntimeError("NOT_FOUND: Function add.0_kernel not found")

  monkeypatch.setattr(cache, "_load", lambda p: lambda *args: Broken())
  np.testing.assert_allclose(program(x), [-1, 0, 1])  # nothing donated: recompiled
  assert cache.stats["errors"] == 1 and not os.path.exists(path)
  np.testing.assert_allclose(program(x + 1), [0, 1, 2])


def test_a_rerun_prefetches_the_programs_of_its_manifest(tmp_path, monkeypatch, layer):
  """The manifest lists a run's programs in first-use order; prefetch loads them in a thread,
  and each program's first call takes the prefetched executable (same results)."""
  f = lambda x: x * 3.0
  g = lambda x, y: {"s": x @ y, "d": y - 1}
  x, y = jnp.arange(4.0), jnp.ones((4, 2))
  first = executables.ExecutableCache(str(tmp_path), "run")
  want_f, want_g = first.jit(f, name="f")(x), first.jit(g, name="g")(x, y)
  assert first.stats["stored"] == 2
  keys = [first.jit(f, name="f").key(_sig(x)), first.jit(g, name="g").key(_sig(x, y))]
  assert first.manifest() == keys
  assert executables.ExecutableCache(str(tmp_path), "other").manifest() == []
  monkeypatch.setenv(executables.PREFETCH_ENV, "0")
  assert not executables.ExecutableCache(str(tmp_path), "run").prefetch()  # turned off
  monkeypatch.delenv(executables.PREFETCH_ENV)
  again = executables.ExecutableCache(str(tmp_path), "run")
  assert again.manifest() == keys
  assert again.prefetch() and not again.prefetch()  # once per cache
  np.testing.assert_array_equal(again.jit(g, name="g")(x, y)["s"], want_g["s"])
  np.testing.assert_array_equal(again.jit(f, name="f")(x), want_f)
  assert again.stats["prefetched"] == 2 and again.stats["loaded"] == 2
  assert again.stats["compiled"] == 0 and again.stats["load_s"] > 0
  # A program already loaded when the prefetch starts is not loaded twice; a listed file that
  # is missing is skipped and one that does not load is loaded or compiled by its caller.
  third = executables.ExecutableCache(str(tmp_path), "run")
  np.testing.assert_array_equal(third.jit(f, name="f")(x), want_f)
  with open(third.path(keys[1]), "wb") as fh:
    fh.write(b"junk")
  os.makedirs(os.path.dirname(third.manifest_path()), exist_ok=True)
  with open(third.manifest_path(), "w") as fh:
    json.dump({"keys": keys + ["0" * 64]}, fh)
  third._manifest = None
  assert third.prefetch()
  np.testing.assert_array_equal(third.jit(g, name="g")(x, y)["d"], want_g["d"])
  assert third.stats["prefetched"] == 0 and third.stats["loaded"] == 1
  assert third.stats["errors"] == 1
  assert third.stats["compiled"] + third.stats["cache_served"] == 1  # JAX's caches may serve it
  # A manifest that is not JSON is an empty one.
  with open(third.manifest_path(), "w") as fh:
    fh.write("{")
  assert executables.ExecutableCache(str(tmp_path), "run").manifest() == []


def _sig(*args):
  leaves, treedef = jax.tree.flatten(args)
  return treedef, tuple(map(executables.leaf_key, leaves))


def test_keys_follow_everything_a_program_depends_on(tmp_path, layer):
  cache = executables.ExecutableCache(str(tmp_path), "run")
  f = lambda x, n: x * n
  p = cache.jit(f, name="f", static=("a",))
  x = jnp.ones((3, 2))
  base = p.key(_sig(x, 2))
  assert p.key(_sig(x, 3)) == base  # a Python scalar's value is traced
  assert p.key(_sig(jnp.ones((3, 2)), 2)) == base  # another array of the same kind
  assert cache.jit(f, name="f", static=("a",)).key(_sig(x, 2)) == base  # a new Program
  different = [
    p.key(_sig(jnp.ones((4, 2)), 2)),  # shape
    p.key(_sig(jnp.ones((3, 2), jnp.bfloat16), 2)),  # dtype
    p.key(_sig(x, 2.0)),  # Python type
    p.key(_sig(np.ones((3, 2), np.float32), 2)),  # a host array
    p.key(_sig(jax.device_put(x, jax.devices()[0]), 2)),  # committed
    p.key(_sig((x,), 2)),  # tree structure
    cache.jit(f, name="f", static=("b",)).key(_sig(x, 2)),  # the site's static values
    cache.jit(f, name="g", static=("a",)).key(_sig(x, 2)),  # the site's name
    cache.jit(f, name="f", static=("a",), donate_argnums=(0,)).key(_sig(x, 2)),
    cache.jit(
      f, name="f", static=("a",), out_shardings=jax.sharding.SingleDeviceSharding(jax.devices()[0])
    ).key(_sig(x, 2)),  # output shardings
    executables.ExecutableCache(str(tmp_path), "other")
    .jit(f, name="f", static=("a",))
    .key(_sig(x, 2)),  # the run's fingerprint
  ]
  assert base not in different and len(set(different)) == len(different)
  # Static arguments' values would have to enter the key: such a site stays a plain jit.
  plain = cache.jit(lambda x, n: x * n, name="s", static_argnums=(1,))
  assert not isinstance(plain, executables.Program)
  np.testing.assert_allclose(plain(x, 3), 3 * np.ones((3, 2)))


def test_sharding_descriptions_name_the_devices():
  devices = jax.devices()
  mesh = jax.sharding.Mesh(np.array(devices[:1]), ("data",))
  named = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  assert executables.describe_sharding(named)[:5] == (
    "named",
    ("data",),
    (1,),
    (devices[0].id,),
    "P('data',)",
  )
  single = jax.sharding.SingleDeviceSharding(devices[0])
  assert executables.describe_sharding(single)[:2] == ("single", devices[0].id)
  assert "mesh" in executables.describe(mesh) and str(devices[0].id) in executables.describe(mesh)


def test_source_and_folder_fingerprints_see_edits(tmp_path, monkeypatch):
  module = tmp_path / "user_loss_for_fingerprint.py"
  module.write_text("SCALE = 1\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  import importlib

  mod = importlib.import_module("user_loss_for_fingerprint")
  try:
    before = executables.source_fingerprint()
    assert executables.source_fingerprint() == before
    module.write_text("SCALE = 2  # edited\n")
    assert executables.source_fingerprint() != before  # a loaded user module's source
  finally:
    sys.modules.pop(mod.__name__, None)
  folder = tmp_path / "hf"
  folder.mkdir()
  (folder / "config.json").write_text('{"rope_theta": 10000}')
  (folder / "model.safetensors").write_bytes(b"weights")
  fp = executables.folder_fingerprint(str(folder))
  (folder / "model.safetensors").write_bytes(b"other weights")  # weights are arguments
  assert executables.folder_fingerprint(str(folder)) == fp
  (folder / "config.json").write_text('{"rope_theta": 500000}')
  assert executables.folder_fingerprint(str(folder)) != fp
  assert executables.folder_fingerprint("") == ""
  assert executables.fingerprint("{}", [str(folder)]) != executables.fingerprint("{}")
  assert executables.fingerprint('{"a": 1}') != executables.fingerprint("{}")


def test_turned_off_by_config_environment_or_no_compilation_cache(monkeypatch):
  monkeypatch.setenv(executables.ENV, "1")
  assert not executables.enabled(True)  # conftest: off in the test process
  monkeypatch.setitem(executables._this_process, "enabled", True)
  assert executables.enabled(True) == bool(jax.config.jax_compilation_cache_dir)
  assert not executables.enabled(False)
  assert executables.for_run("{}", configured=False) is None
  monkeypatch.setenv(executables.ENV, "0")
  assert not executables.enabled(True) and executables.for_run("{}") is None
  assert executables.jit(lambda x: x, name="f")(1) == 1  # a plain jit then
  c = defaults.base_config()
  with c.ignore_type():
    c.executable_cache = "yes"
  with pytest.raises(ConfigError, match="executable_cache must be True or False"):
    validate(c)


def _reader():
  from jax._src import compilation_cache  # pylint: disable=import-outside-toplevel

  return compilation_cache.extract_executable_and_time


def _listeners():
  from jax._src import monitoring  # pylint: disable=import-outside-toplevel

  return list(monitoring.get_event_listeners()), list(monitoring.get_event_duration_listeners())


def test_private_jax_apis_exist():
  """Every private JAX API the layer relies on is there: when a JAX upgrade moves one, this
  fails saying which (and runs get one warning and no stored programs, see below)."""
  for name in jax_internals.missing():
    pytest.fail(
      f"parallel/executables.py relies on {name}, which this JAX ({jax.__version__}) "
      f"no longer has; {jax_internals.HINT}"
    )


def test_the_layer_touches_jax_only_while_installed(tmp_path):
  """Importing the package changed nothing (the test session installs no store); install
  wraps JAX's cache reader and adds two listeners, once however often it is called; install(None)
  restores both, and jit is a plain jax.jit again."""
  reader, listeners = _reader(), _listeners()
  assert reader.__module__ == "jax._src.compilation_cache" and not jax_internals.active()
  assert executables.installed() is None
  store = executables.ExecutableCache(str(tmp_path), "run")
  try:
    assert executables.install(store) is store and executables.install(store) is store
    assert executables.installed() is store and _reader() is not reader
    assert [len(x) for x in _listeners()] == [len(x) + 1 for x in listeners]
    program = executables.jit(lambda x: x * 2, name="double")
    assert isinstance(program, executables.Program)
    np.testing.assert_allclose(program(jnp.arange(3.0)), [0, 2, 4])
    assert store.stats["compiled"] + store.stats["cache_served"] == 1
  finally:
    executables.install(None)
  assert executables.installed() is None and not jax_internals.active()
  assert _reader() is reader and _listeners() == listeners
  assert not isinstance(executables.jit(lambda x: x, name="f"), executables.Program)
  assert not executables.prefetch() and executables.stats() is None
  # A store used while uninstalled is a plain jit too.
  assert not isinstance(store.jit(lambda x: x, name="f"), executables.Program)


def test_a_jax_without_a_private_api_gets_one_warning_and_no_store(tmp_path, monkeypatch, caplog):
  monkeypatch.setattr(
    jax_internals,
    "MODULE_APIS",
    jax_internals.MODULE_APIS + (("jax._src.compilation_cache", "an_api_that_moved"),),
  )
  monkeypatch.setitem(executables._installed, "warned", False)
  reader, listeners = _reader(), _listeners()
  store = executables.ExecutableCache(str(tmp_path), "run")
  with caplog.at_level("WARNING", logger=executables.__name__):
    assert executables.install(store) is None and executables.install(store) is None
  warnings = [r.getMessage() for r in caplog.records if r.name == executables.__name__]
  assert len(warnings) == 1, warnings
  assert (
    "relies on jax._src.compilation_cache.an_api_that_moved, which this JAX "
    f"({jax.__version__}) no longer has" in warnings[0]
  )
  assert "executable_cache=False" in warnings[0]
  assert executables.installed() is None and _reader() is reader and _listeners() == listeners
  assert executables.jit(lambda x: x + 1, name="f")(1) == 2


def test_main_installs_the_runs_store(tmp_path, monkeypatch):
  """posttrain_jax.main installs a store next to JAX's compilation cache, keyed lazily (the
  run writes its tokenizer folder later); nothing when the layer is off."""
  from posttrain_jax import main
  from posttrain_jax.train import context

  config = defaults.base_config()
  try:
    main.install_executables(config, str(tmp_path / "run"))
    assert executables.installed() is None  # conftest: off in this process
    monkeypatch.setitem(executables._this_process, "enabled", True)
    main.install_executables(config, str(tmp_path / "run"))
    store = executables.installed()
    assert store.directory == os.path.join(jax.config.jax_compilation_cache_dir, executables.SUBDIR)
    (tmp_path / "run" / "tokenizer").mkdir(parents=True)
    (tmp_path / "run" / "tokenizer" / "vocab.json").write_text("{}")
    assert store.run_fingerprint == executables.fingerprint(
      config.to_json_best_effort(sort_keys=True), [str(tmp_path / "run" / "tokenizer")]
    )
    config.executable_cache = False
    assert context.executable_store(config, str(tmp_path / "run")) is None
  finally:
    executables.install(None)
