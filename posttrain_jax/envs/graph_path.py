"""Paths in a small random directed graph (Feedback Distillation's toy, methods_B.md section 7).

Prompt ``"ab ac bd cb cd da:ad="``: the edge list (sorted, each edge two node letters), then the
start and the target. A completion is a path written as node letters, e.g. ``"abd"``; it is
correct iff it is a *simple* path (no node twice) from the start to the target whose every step
is an edge and that takes at most one step more than the shortest path (``max_steps``). A
problem usually has several correct paths (``solutions``), so the number of distinct correct
answers measures a policy's diversity (TS-OPSD, section 2).

Level ``L`` (1 to 5) sets the graph (``SHAPES``: nodes named ``a, b, ...``, each with the same
number of out-edges to distinct other nodes); the target lies 2 or more steps from the start.
``feedback`` names the first invalid step of an attempt and a valid alternative (``"ac!ab"``:
a->c is no good, take a->b), ``corrupt`` makes a plausible wrong attempt.

How hard it is (a walker that does not plan, and pretraining runs): docs/envs.md.
"""

import collections

import jax
import numpy as np

from posttrain_jax.envs import base

NAME = "graph_path"
NODES = "abcdefgh"
CHARS = NODES + " :="
SHAPES = {1: (5, 2), 2: (6, 2), 3: (8, 2), 4: (8, 3), 5: (8, 4)}  # level: (nodes, out-degree)
LEVELS = tuple(SHAPES)
SLACK = 1  # a correct path takes at most the shortest path's steps + SLACK
OK = "OK"  # the feedback on a correct path
UNKNOWN = "-"  # stands for a character of an attempt that names no node


def num_nodes(level: int) -> int:
  return SHAPES[level][0]


def _successors(edges) -> dict[str, list[str]]:
  out = collections.defaultdict(list)
  for u, v in edges:
    out[u].append(v)
  return {u: sorted(vs) for u, vs in out.items()}


def _distances_to(edges, target: str, blocked=frozenset()) -> dict[str, int]:
  """Steps from each node to ``target`` in the graph without the nodes ``blocked`` (BFS)."""
  into = collections.defaultdict(list)
  for u, v in edges:
    into[v].append(u)
  dist, queue = {target: 0}, collections.deque([target])
  while queue:
    v = queue.popleft()
    for u in into[v]:
      if u not in dist and u not in blocked:
        dist[u] = dist[v] + 1
        queue.append(u)
  return dist


def _remaining(edges, prefix: str, target: str) -> int | None:
  """Fewest steps from the last node of ``prefix`` to ``target`` avoiding its earlier nodes."""
  return _distances_to(edges, target, blocked=frozenset(prefix[:-1])).get(prefix[-1])


def _next_toward(edges, node: str, target: str, visited) -> str | None:
  """The out-neighbour of ``node`` that starts a shortest simple continuation to ``target``
  avoiding ``visited`` (alphabetically first among ties), or None when there is none."""
  dist = _distances_to(edges, target, blocked=frozenset(visited) | {node})
  options = [v for v in _successors(edges).get(node, []) if v in dist]
  return min(options, key=lambda v: (dist[v], v)) if options else None


class GraphPath(base.GeneratedEnv):
  """A simple path from the start to the target of a small random directed graph."""

  name = NAME
  chars = CHARS
  levels = LEVELS

  def __init__(self, eval_percent: int = 10):
    self.eval_percent = eval_percent

  def max_prompt_chars(self, level: int) -> int:
    nodes, degree = SHAPES[level]
    return 3 * nodes * degree + 3

  def max_answer_chars(self, level: int) -> int:
    return num_nodes(level)

  def max_feedback_chars(self, level: int) -> int:
    return len("ab!ac")

  # -- problems ---------------------------------------------------------------------------------
  def make(self, edges, start: str, target: str, level: int) -> base.Problem:
    """The problem of the directed graph ``edges`` (pairs of node letters)."""
    edges = tuple(sorted(tuple(e) for e in edges))
    prompt = " ".join(u + v for u, v in edges) + f":{start}{target}="
    answer = start
    while answer[-1] != target:  # the alphabetically first shortest path
      step = _next_toward(edges, answer[-1], target, answer)
      if step is None:
        raise ValueError(f"{target!r} cannot be reached from {start!r} in {prompt!r}")
      answer += step
    return base.Problem(
      prompt=prompt,
      answer=answer,
      env=NAME,
      level=level,
      uid=prompt,
      data=(edges, start, target, len(answer) - 1 + SLACK),
    )

  def _draw(self, rng: np.random.Generator, level: int) -> base.Problem:
    size, degree = SHAPES[level]
    nodes = NODES[:size]
    while True:
      edges = []
      for u in nodes:
        others = [v for v in nodes if v != u]
        edges += [(u, others[j]) for j in rng.choice(len(others), degree, replace=False)]
      start, target = (nodes[i] for i in rng.choice(len(nodes), 2, replace=False))
      dist = _distances_to(edges, target).get(start)
      if dist is not None and dist >= 2:
        return self.make(edges, start, target, level)

  def rebuild(self, problem: base.Problem) -> base.Problem:
    """The problem regenerated from its graph (``data``, else the prompt): a stored problem
    must equal it."""
    self._check_level(problem.level)
    if problem.data:
      edges, start, target, _ = problem.data
    else:
      listed, _, query = problem.prompt.removesuffix("=").partition(":")
      edges, (start, target) = [tuple(e) for e in listed.split()], query
    nodes = set(NODES[: num_nodes(problem.level)])
    if not all(len(e) == 2 and set(e) <= nodes for e in edges) or not {start, target} <= nodes:
      raise ValueError(f"graph {problem.prompt!r} names nodes outside {''.join(sorted(nodes))}")
    return self.make(edges, start, target, problem.level)

  # -- answers ----------------------------------------------------------------------------------
  def verify(self, problem: base.Problem, completion: str) -> float:
    """1.0 iff the completion (whitespace-stripped) is a simple path from the start to the
    target along the graph's edges in at most ``max_steps`` steps."""
    if not isinstance(completion, str):
      return 0.0
    path = completion.strip()
    edges, start, target, max_steps = problem.data
    edge_set = set(edges)
    ok = (
      2 <= len(path) <= max_steps + 1
      and path[0] == start
      and path[-1] == target
      and len(set(path)) == len(path)
      and all((u, v) in edge_set for u, v in zip(path, path[1:]))
    )
    return float(ok)

  def solutions(self, problem: base.Problem) -> list[str]:
    """Every correct completion, sorted: the simple paths from the start to the target of at
    most ``max_steps`` steps."""
    edges, start, target, max_steps = problem.data
    succ, out = _successors(edges), []

    def extend(path):
      if path[-1] == target:
        out.append(path)
      elif len(path) <= max_steps:
        for v in succ.get(path[-1], []):
          if v not in path:
            extend(path + v)

    extend(start)
    return sorted(out)

  def num_solutions(self, problem: base.Problem) -> int:
    return len(self.solutions(problem))

  def random_walk(self, problem: base.Problem, rng: np.random.Generator) -> str:
    """A walk from the start that picks uniformly among unvisited out-neighbours and stops at
    the target, when stuck or after ``max_steps`` steps (the difficulty baseline)."""
    edges, start, target, max_steps = problem.data
    succ, path = _successors(edges), start
    while path[-1] != target and len(path) <= max_steps:
      options = [v for v in succ.get(path[-1], []) if v not in path]
      if not options:
        break
      path += options[rng.integers(len(options))]
    return path

  def random_walk_success(self, key, n: int, *, level: int) -> float:
    """The random walker's success rate on ``n`` train problems of ``level``."""
    rng = base.numpy_rng(jax.random.fold_in(key, 1))
    problems = self.sample(key, n, level=level)
    return float(np.mean([self.verify(p, self.random_walk(p, rng)) for p in problems]))

  def feedback(self, problem: base.Problem, completion: str) -> str:
    """``"OK"`` for a correct path, else ``"<bad>!<fix>"``: ``bad`` the first invalid step as
    written, ``fix`` the first step of a shortest continuation to the target from the last
    valid node. A step is invalid when it is no edge, revisits a node, or leaves the target
    out of reach within ``max_steps``. A wrong start gives ``"c!a"`` (start at a), an invalid
    step ``"ac!ab"``, a path that stops short at ``b`` ``"b!bd"``, a path that runs on past
    the target ``d`` ``"dc!d"``. A character naming no node is written ``-``."""
    if self.verify(problem, completion):
      return OK
    edges, start, target, max_steps = problem.data
    nodes = set(NODES[: num_nodes(problem.level)])
    path = "".join(c if c in nodes else UNKNOWN for c in str(completion).strip())
    if not path or path[0] != start:
      return f"{path[:1]}!{start}"
    edge_set = set(edges)
    for i in range(1, len(path) + 1):
      u = path[i - 1]
      if u == target:  # the path reached the target and went on
        return f"{path[i - 1 : i + 1]}!{target}"
      if i == len(path) or (u, path[i]) not in edge_set or path[i] in path[:i]:
        break
      left = _remaining(edges, path[: i + 1], target)
      if left is None or i + left > max_steps:
        break
    return f"{path[i - 1 : i + 1]}!{u}{_next_toward(edges, u, target, path[: i - 1])}"

  def corrupt(self, problem: base.Problem, rng: np.random.Generator) -> str:
    """A plausible wrong path: a correct path with one inner node swapped for another node, or
    cut short before the target (each half of the time); never a correct one."""
    paths = self.solutions(problem)
    nodes = NODES[: num_nodes(problem.level)]
    while True:
      path = paths[rng.integers(len(paths))]
      if rng.random() < 0.5:
        attempt = path[: rng.integers(1, len(path))]
      else:
        i = int(rng.integers(1, len(path)))
        attempt = path[:i] + nodes[rng.integers(len(nodes))] + path[i + 1 :]
      if not self.verify(problem, attempt):
        return attempt

  def corpus(self, key, n: int, *, level: int, noise: float = 0.0) -> list[tuple[str, str]]:
    """``n`` (prompt, path) pretraining pairs from the train split; each path drawn uniformly
    among the problem's correct paths (the corpus shows their diversity), a fraction ``noise``
    replaced by a plausible wrong path (``corrupt``)."""
    if not 0.0 <= noise <= 1.0:
      raise ValueError(f"corpus noise must lie in [0, 1], got {noise}")
    problems = self.sample(key, n, level=level, split="train")
    rng = base.numpy_rng(jax.random.fold_in(key, 1))
    out = []
    for p in problems:
      paths = self.solutions(p)
      completion = paths[rng.integers(len(paths))]
      if rng.random() < noise:
        completion = self.corrupt(p, rng)
      out.append((p.prompt, completion))
    return out
