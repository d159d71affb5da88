"""The persistent compilation cache a run enables (parallel/compile_cache.py)."""

import os
import subprocess
import sys

import pytest

from posttrain_jax import defaults
from posttrain_jax.methods import validate
from posttrain_jax.parallel import compile_cache
from posttrain_jax.train import ConfigError

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_resolve_dir(monkeypatch):
  monkeypatch.delenv(compile_cache.ENV, raising=False)
  assert compile_cache.resolve_dir(None) == os.path.expanduser(compile_cache.DEFAULT_DIR)
  assert compile_cache.resolve_dir("") == ""
  assert compile_cache.resolve_dir("/x/y") == "/x/y"
  monkeypatch.setenv(compile_cache.ENV, "/from/env")
  assert compile_cache.resolve_dir("/x/y") == "/from/env"
  monkeypatch.setenv(compile_cache.ENV, "")
  assert compile_cache.resolve_dir("/x/y") == ""


def test_the_test_process_keeps_its_own_cache():
  import jax

  before = jax.config.jax_compilation_cache_dir
  assert before  # tests/conftest.py set it
  assert compile_cache.enable("/somewhere/else") == before
  assert jax.config.jax_compilation_cache_dir == before


def test_bad_cache_dir_type_is_a_config_error():
  c = defaults.base_config()
  del c.compilation_cache_dir  # the defaults' field is typed; a hand-built config is not
  c.compilation_cache_dir = 3
  with pytest.raises(ConfigError, match="compilation_cache_dir"):
    validate(c)


_RERUN = r"""
import sys, jax
from posttrain_jax.parallel import compile_cache
hits = []
jax.monitoring.register_event_listener(
    lambda e, **k: hits.append(e) if e == "/jax/compilation_cache/cache_hits" else None)
print("DIR", compile_cache.enable(sys.argv[1]))
f = jax.jit(lambda x: (x * 2.0 + 1.0).sum())
f(jax.numpy.ones((3, 5))).block_until_ready()
print("HITS", len(hits))
"""


def test_a_second_process_loads_the_program_from_the_cache(tmp_path):
  """Fresh processes (no cache set): the first compiles and writes, the second reads."""
  env = {k: v for k, v in os.environ.items() if k != compile_cache.ENV}
  env["PYTHONPATH"] = REPO
  cache = str(tmp_path / "xla")
  outs = [
    subprocess.run(
      [sys.executable, "-c", _RERUN, cache], capture_output=True, text=True, env=env, timeout=300
    )
    for _ in range(2)
  ]
  for o in outs:
    assert o.returncode == 0, o.stderr[-2000:]
  assert f"DIR {cache}" in outs[0].stdout
  hits = [int(o.stdout.split("HITS ")[1]) for o in outs]
  assert hits[0] == 0 and hits[1] > 0, hits
  assert os.listdir(cache)


def test_an_unwritable_cache_dir_is_a_clear_error(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  env = {k: v for k, v in os.environ.items() if k != compile_cache.ENV}
  env["PYTHONPATH"] = REPO
  code = (
    "from posttrain_jax.parallel import compile_cache\n"
    f"compile_cache.enable({str(blocker / 'sub')!r})"
  )
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
  )
  assert out.returncode != 0
  assert "compilation_cache_dir" in out.stderr and "writable" in out.stderr
