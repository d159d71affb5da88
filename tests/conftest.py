"""Test setup: float32 matmuls, a persistent compilation cache, shared fixtures."""

import inspect
import os
import re

from posttrain_jax.parallel import host as _host  # before JAX starts its threads

_host.tune_host_allocator()

import jax
import pytest

jax.config.update("jax_default_matmul_precision", "highest")
# Outside the work tree (never committed); POSTTRAIN_JAX_TEST_CACHE moves it.
_CACHE = os.environ.get("POSTTRAIN_JAX_TEST_CACHE") or os.path.join(
  os.path.expanduser("~"), ".cache", "posttrain_jax", "test-xla"
)
jax.config.update("jax_compilation_cache_dir", _CACHE)
# Runs started in subprocesses (scripts, the entry point) use it too, not ~/.cache.
os.environ["POSTTRAIN_JAX_COMPILATION_CACHE"] = _CACHE
jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
# Stored whole programs are keyed by source and config, not by what a test patches at run
# time: off in this process (tests/parallel/test_executables.py builds its own caches), on by
# default in the runs tests start as subprocesses (scripts, the entry point), as for users.
from posttrain_jax.parallel import executables as _executables  # noqa: E402

_executables.disable_in_this_process()

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


@pytest.fixture(scope="session")
def repo_root():
  return REPO


# The longest tests (subprocess runs of whole experiments, 30-200 s each on 2 cores) go first,
# so that `pytest -n 2` does not end with one worker finishing a long test while the other idles.
SLOW_FIRST = (
  "test_reproduce_smoke[cero.py]",
  "test_reproduce_smoke[tron.py]",
  "sweeps/test_reproduce_smoke.py",
  "parallel/test_mesh.py",
  "train/test_sampler_mesh.py",
  "train/test_hf_run.py",
  "test_main.py",
  "faults/test_faults_finite.py",
  "faults/test_faults_workdir.py",
  "faults/test_faults_errors.py",
  "parallel/test_multihost.py",
  "parallel/test_mesh_checkpoint.py",
  "sweeps/test_bench.py",
  "train/test_async_rollouts.py",
  "train/test_teacher.py",
)


# `make test-fast` leaves out the tests marked `slow`: those that start subprocesses or run whole
# stages of an experiment, found by what the test function or one of its fixtures calls.
SLOW_CALLS = re.compile(
  r"subprocess|sys\.executable|\bmethods_lib\.run\(|\bmake_context\(|\brl(?:_lib)?\.run\("
  r"|\bpretrain\.run\(|\breward_model(?:_lib)?\.run\(|run_reproduce|_reproduce\(|main\.main\("
  r"|\brl_fixtures\.|\bmesh_fixtures\.run|\btrain_run\(|\b_run\(|\brun_rl\("
)


def _source(fn) -> str:
  try:
    return inspect.getsource(fn)
  except (OSError, TypeError):
    return ""


def _is_slow(item) -> bool:
  fn = getattr(item, "function", None)
  if fn is None:
    return False
  sources = [_source(fn)]
  info = getattr(item, "_fixtureinfo", None)
  for name in getattr(info, "names_closure", ()):
    for fixturedef in info.name2fixturedefs.get(name, ()):
      if "tests" in getattr(fixturedef, "baseid", "tests") or fixturedef.baseid == "":
        sources.append(_source(fixturedef.func))
  return any(SLOW_CALLS.search(s) for s in sources)


def _listed_slow() -> set[str]:
  """tests/slow_tests.txt: node ids of tests slow for their time alone."""
  path = os.path.join(os.path.dirname(__file__), "slow_tests.txt")
  with open(path, encoding="utf-8") as f:
    return {line.strip() for line in f if line.strip() and not line.startswith("#")}


def pytest_collection_modifyitems(config, items):
  del config
  listed = _listed_slow()
  for item in items:
    if item.nodeid in listed or _is_slow(item):
      item.add_marker(pytest.mark.slow)

  def rank(item):
    hits = [i for i, name in enumerate(SLOW_FIRST) if name in item.nodeid]
    return hits[0] if hits else len(SLOW_FIRST)

  items.sort(key=rank)  # stable: the order within a file is kept
