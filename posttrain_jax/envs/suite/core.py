"""Generator-verifier programs (TRON, arXiv 2606.01599): the machinery every suite task shares.

A task draws a latent state ``z = draw(rng, level)``, renders the question ``render(z)`` and knows
the exact answer ``solve(z)``. The prompt is ``TAG + render(z) + "="``, where the one-character
``tag`` names the task, so a model trained on a mix of tasks can tell them apart. The verifier is
an exact string match of the whitespace-stripped completion against ``solve(z)``; every task in
the suite has exactly one correct answer string. ``wrong(z)`` is a systematically wrong answer
(a plausible rule-following mistake, like arithmetic's forgotten carries) for noisy corpora.

Generation is host-side Python: a ``random.Random`` seeded from the JAX key, so the same key
always gives the same instances and a draw costs microseconds.
"""

import random

import jax

from posttrain_jax.envs import base

PREFIX = "tron/"
DIGITS = "0123456789"
LETTERS = "abcdefgh"
MOVES = "UDLR"
MAX_COMPLETION_CHARS = 64


def python_rng(key: jax.Array) -> random.Random:
  """A ``random.Random`` seeded deterministically from a JAX key."""
  return random.Random(int(base.numpy_rng(key).integers(2**63)))


class TaskEnv:
  """One generator-verifier program with difficulty levels ``levels`` (1..N, harder upward).

  Subclasses set ``short`` (registered as ``tron/<short>``), ``tag``, ``bucket``, ``body_chars``,
  ``answer_chars`` and ``levels``, and define ``draw``, ``render``, ``solve``, ``wrong``,
  ``max_body_chars`` and ``max_answer_chars``. The latent state is a tuple of ints and strings
  (stored as ``Problem.data``), so it survives a JSON round trip.
  """

  short = ""
  tag = ""
  bucket = ""
  body_chars = ""
  answer_chars = ""
  levels: tuple = ()

  def __init__(self, eval_percent: int = 10):
    self.eval_percent = eval_percent

  # --- what a task defines -------------------------------------------------------------------
  def draw(self, rng: random.Random, level: int) -> tuple:
    raise NotImplementedError

  def render(self, z: tuple) -> str:
    raise NotImplementedError

  def solve(self, z: tuple) -> str:
    raise NotImplementedError

  def wrong(self, z: tuple) -> str:
    raise NotImplementedError

  def max_body_chars(self, level: int) -> int:
    raise NotImplementedError

  def max_answer_chars(self, level: int) -> int:
    raise NotImplementedError

  # --- the shared protocol -------------------------------------------------------------------
  @property
  def name(self) -> str:
    return PREFIX + self.short

  @property
  def chars(self) -> str:
    return "".join(sorted(set(self.tag + self.body_chars + "=" + self.answer_chars)))

  def max_prompt_chars(self, level: int) -> int:
    return len(self.tag) + self.max_body_chars(level) + 1

  def check_level(self, level: int) -> None:
    if level not in self.levels:
      raise ValueError(
        f"{self.name} level must be in {self.levels[0]}..{self.levels[-1]}, got {level}"
      )

  def make(self, z: tuple, level: int) -> base.Problem:
    prompt = f"{self.tag}{self.render(z)}="
    return base.Problem(
      prompt=prompt, answer=self.solve(z), env=self.name, level=level, uid=prompt, data=tuple(z)
    )

  def sample(self, key, n: int, *, level: int, split: str = "train") -> list[base.Problem]:
    """``n`` problems of ``level`` from ``split`` (disjoint by uid hash), drawn from ``key``."""
    self.check_level(level)
    base.check_split(split)
    rng = python_rng(key)
    draw = lambda r: self.make(self.draw(r, level), level)
    return base.sample_until(rng, n, draw, split, self.eval_percent)

  def verify(self, problem: base.Problem, completion) -> float:
    """1.0 iff the whitespace-stripped completion equals the unique answer; never raises."""
    if not isinstance(completion, str) or len(completion) > MAX_COMPLETION_CHARS:
      return 0.0
    return float(completion.strip() == problem.answer)

  def corpus(self, key, n: int, *, level: int, noise: float = 0.0) -> list[tuple[str, str]]:
    """``n`` (prompt, answer) pretraining pairs from the train split; a fraction ``noise`` of
    answers is the task's systematic mistake ``wrong(z)`` instead."""
    if not 0.0 <= noise <= 1.0:
      raise ValueError(f"corpus noise must lie in [0, 1], got {noise}")
    problems = self.sample(key, n, level=level, split="train")
    flips = base.numpy_rng(jax.random.fold_in(key, 1)).random(n) < noise
    return [(p.prompt, self.wrong(p.data) if w else p.answer) for p, w in zip(problems, flips)]

  def rebuild(self, problem: base.Problem) -> base.Problem:
    """The problem regenerated from its stored latent state; a stored problem must equal it."""
    return self.make(tuple(problem.data), problem.level)

  def wrong_answer(self, problem: base.Problem) -> str:
    """The systematic mistake for a stored problem (used by static datasets' noisy corpora)."""
    return self.wrong(tuple(problem.data))

  def __repr__(self) -> str:
    return f"{type(self).__name__}(name={self.name!r}, bucket={self.bucket!r})"


def sticky_string(rng: random.Random, n: int, alphabet: str, stay: float) -> str:
  """A random string whose next symbol repeats the previous one with probability ``stay``."""
  out = [rng.choice(alphabet)]
  while len(out) < n:
    out.append(out[-1] if rng.random() < stay else rng.choice(alphabet))
  return "".join(out)


def walk(moves: str) -> list[tuple[int, int]]:
  """Cells visited by a walk from (0, 0); U/D change y by +1/-1, R/L change x by +1/-1."""
  step = {"U": (0, 1), "D": (0, -1), "R": (1, 0), "L": (-1, 0)}
  cells = [(0, 0)]
  for m in moves:
    dx, dy = step[m]
    cells.append((cells[-1][0] + dx, cells[-1][1] + dy))
  return cells


def int_width(lo: int, hi: int) -> int:
  """Characters needed to write any integer in [lo, hi]."""
  return max(len(str(lo)), len(str(hi)))
