"""The package's import graph: no cycle anywhere (lazy imports inside functions included), and
the layer rule of DESIGN.md section 1. Read from the source with ``ast``; nothing is imported."""

import ast
import os

import pytest

PACKAGE = "posttrain_jax"
ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), PACKAGE)

# Leaf modules every layer may import: errors and name lookup, the table of random streams.
LEAVES = ("registry", "streams")

# What each layer may import of the package (besides itself and the leaves),
# DESIGN.md section 1.
LOWER = ("objectives", "io", "parallel")
ALLOWED = {
  "objectives": set(),
  "io": set(),
  "parallel": set(),
  "models": {"parallel"},
  "rollout": {"models", "parallel"},
  # envs read rewards' checkers (math answers, the code sandbox): rewards sits below envs.
  "envs": {"objectives", "io", "parallel", "models", "rollout", "rewards"},
  "rewards": {"objectives", "io", "parallel", "models", "rollout"},
  "scheduling": {"objectives", "io", "parallel", "models", "rollout", "envs"},
  "modelops": {"objectives", "io", "parallel", "models", "rollout"},
  "analysis": {"objectives", "io", "parallel", "models", "rollout", "envs"},
}


def _modules() -> dict[str, str]:
  """Dotted module name -> file path, for every .py file of the package."""
  out = {}
  for folder, _, files in os.walk(ROOT):
    for f in files:
      if not f.endswith(".py"):
        continue
      rel = os.path.relpath(os.path.join(folder, f), os.path.dirname(ROOT))[:-3]
      parts = rel.split(os.sep)
      if parts[-1] == "__init__":
        parts = parts[:-1]
      out[".".join(parts)] = os.path.join(folder, f)
  return out


def _imports(name: str, path: str, modules: dict) -> set[str]:
  """The package modules ``name`` imports anywhere in its file (a ``from pkg import sub`` of a
  submodule is an edge to the submodule; the implicit import of parent packages is not)."""
  tree = ast.parse(open(path, encoding="utf-8").read())
  is_pkg = path.endswith("__init__.py")
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out |= {a.name for a in node.names if a.name in modules}
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        anchor = name.split(".") if is_pkg else name.split(".")[:-1]
        anchor = anchor[: len(anchor) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
      for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in modules:
          out.add(sub)
        elif base in modules:
          out.add(base)
  out.discard(name)
  return out


def _graph() -> dict[str, set[str]]:
  modules = _modules()
  return {n: _imports(n, p, modules) for n, p in modules.items()}


def _cycle(graph: dict) -> list[str] | None:
  """One import cycle as a list of modules (first == last), or None."""
  state, stack = {}, []

  def visit(node):
    state[node] = 1
    stack.append(node)
    for nxt in sorted(graph[node]):
      if state.get(nxt) == 1:
        return stack[stack.index(nxt) :] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    stack.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return None


def test_the_package_has_no_import_cycle():
  cycle = _cycle(_graph())
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one():
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": set()}) is None


def _layer(module: str) -> str:
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else ""


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_rule(layer):
  graph = _graph()
  bad = []
  for module, targets in graph.items():
    if _layer(module) != layer:
      continue
    for t in targets:
      other = _layer(t)
      if other not in (layer,) + LEAVES and other not in ALLOWED[layer]:
        bad.append(f"{module} imports {t}")
  assert not bad, (
    f"DESIGN.md section 1: {layer}/ may import only "
    f"{sorted(ALLOWED[layer]) or 'nothing'} of the package (and registry): "
    + "; ".join(sorted(bad))
  )


# Above the engine: the methods, what runs whole experiments (sweeps, benchmarks, main.py) and
# the reference docs generator (docgen.py, which reads every table) and the default experiment
# config (defaults.py: the engine's sections and every method's).
TOP = ("methods", "sweeps", "bench", "main", "docgen", "defaults")


def test_nothing_below_train_imports_train():
  graph = _graph()
  bad = [
    f"{m} imports {t}"
    for m, targets in graph.items()
    for t in targets
    if _layer(t) == "train" and _layer(m) not in ("train",) + TOP
  ]
  assert not bad, (
    "only methods/, sweeps/, bench/, main.py, docgen.py and defaults.py may import train/: "
    + "; ".join(sorted(bad))
  )


def test_the_engine_imports_no_method():
  """DESIGN.md section 4: methods/ may import train/'s engine API, never the reverse; the
  engine is handed the METHODS table (main.py, sweeps/, posttrain_jax.methods.run)."""
  graph = _graph()
  bad = [
    f"{m} imports {t}"
    for m, targets in graph.items()
    for t in targets
    if _layer(t) == "methods" and _layer(m) not in TOP
  ]
  assert not bad, (
    "only sweeps/, bench/, main.py, docgen.py and defaults.py may import methods/: "
    + "; ".join(sorted(bad))
  )


def test_the_leaves_import_nothing_of_the_package():
  graph = _graph()
  for leaf in LEAVES:
    assert not graph[f"{PACKAGE}.{leaf}"], f"{leaf} must stay a leaf: {graph[PACKAGE + '.' + leaf]}"
