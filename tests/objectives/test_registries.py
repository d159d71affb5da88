"""The package registries are built once, in objectives/registries.py, from the files' dicts."""

import importlib
import json
import os
import pkgutil
import subprocess
import sys
import types

import pytest

from posttrain_jax import objectives
from posttrain_jax.objectives import registries

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KINDS = (
  "ADVANTAGES",
  "POLICY_LOSSES",
  "KL_ESTIMATORS",
  "AGGREGATIONS",
  "AUX_LOSSES",
  "IS_CORRECTIONS",
  "CONTROLLERS",
  "VALUE_LOSSES",
  "SHAPINGS",
  "DIVERGENCES",
  "PREFERENCE_LOSSES",
  "CONSOLIDATIONS",
)


def _files():
  """Every module of objectives except the package and registries.py, imported."""
  names = [m.name for m in pkgutil.iter_modules(objectives.__path__)]
  return [
    importlib.import_module(f"posttrain_jax.objectives.{n}")
    for n in sorted(names)
    if n != "registries"
  ]


def _holders(kind):
  """The files that define (not import) a dict named ``kind``."""
  out = []
  for module in _files():
    own = module.__dict__.get(kind)
    if isinstance(own, dict) and not any(own is getattr(m, kind, None) for m in out):
      out.append(module)
  return out


@pytest.mark.parametrize("kind", KINDS)
def test_registry_is_the_union_of_its_files(kind):
  holders = _holders(kind)
  assert holders, kind
  assert {m.__name__ for m in registries.SOURCES[kind]} == {m.__name__ for m in holders}
  union = {}
  for module in holders:
    part = getattr(module, kind)
    assert not set(part) & set(union), (kind, module.__name__, set(part) & set(union))
    union.update(part)
  registry = getattr(objectives, kind)
  assert registry is getattr(registries, kind)
  assert registry == union
  assert all(registry[name] is union[name] for name in union)


def test_every_kind_is_merged():
  assert set(registries.SOURCES) == set(KINDS)
  assert set(KINDS) <= set(objectives.__all__)


def test_duplicate_name_across_files_raises():
  a, b = types.ModuleType("fake_a"), types.ModuleType("fake_b")
  a.ADVANTAGES = {"grpo": len, "only_a": abs}
  b.ADVANTAGES = {"only_b": min, "grpo": max}
  with pytest.raises(
    ValueError,
    match=r"ADVANTAGES: 'grpo' is defined twice, in fake_a and in "
    r"fake_b",
  ):
    registries.merge("ADVANTAGES", (a, b))
  assert registries.merge("ADVANTAGES", (a,)) == a.ADVANTAGES
  assert registries.merge("ADVANTAGES", (a,)) is not a.ADVANTAGES  # a new dict


def test_merging_leaves_the_files_dicts_alone():
  before = {
    (m.__name__, kind): dict(getattr(m, kind)) for kind in KINDS for m in registries.SOURCES[kind]
  }
  for kind in KINDS:
    registries.merge(kind, registries.SOURCES[kind])
  after = {
    (m.__name__, kind): dict(getattr(m, kind)) for kind in KINDS for m in registries.SOURCES[kind]
  }
  assert after == before


_TWICE = """
import importlib, json, sys
KINDS = %r

def names(objectives, registries):
  regs = {k: [(n, getattr(f, "__qualname__", type(f).__name__))
              for n, f in getattr(objectives, k).items()] for k in KINDS}
  files = {f"{m.__name__}.{k}": list(getattr(m, k)) for k in KINDS
           for m in registries.SOURCES[k]}
  return regs, files

o1 = importlib.import_module("posttrain_jax.objectives")
r1 = importlib.import_module("posttrain_jax.objectives.registries")
first = names(o1, r1)
for name in [n for n in sys.modules if n.startswith("posttrain_jax.objectives")]:
  del sys.modules[name]
o2 = importlib.import_module("posttrain_jax.objectives")
r2 = importlib.import_module("posttrain_jax.objectives.registries")
print(json.dumps({"fresh": o2 is not o1, "same": names(o2, r2) == first,
                  "first_untouched": names(o1, r1) == first,
                  "sizes": {k: len(v) for k, v in first[0].items()}}))
"""


def test_importing_twice_changes_no_registry():
  env = dict(
    os.environ,
    PYTHONPATH=os.pathsep.join(
      [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    ),
  )
  proc = subprocess.run(
    [sys.executable, "-c", _TWICE % (KINDS,)],
    capture_output=True,
    text=True,
    timeout=300,
    env=env,
    cwd=ROOT,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["fresh"] and out["same"] and out["first_untouched"], out
  assert out["sizes"] == {k: len(getattr(objectives, k)) for k in KINDS}
