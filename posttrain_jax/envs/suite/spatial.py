"""Bucket 'spatial': position after moves on a grid, manhattan distance, cells visited."""

from posttrain_jax.envs.suite import core
from posttrain_jax.envs.suite.core import DIGITS, MOVES

MANHATTAN_RANGES = (4, 8, 16, 32, 100, 1000)


def _moves(level: int) -> int:
  return 2 * level + 2


class Grid(core.TaskEnv):
  """``GUURDL=`` -> ``0 1`` (x y after the moves from 0 0; U is +y, R is +x). Level 1..8:
  2*level+2 moves. Systematic mistake: mirror the vertical axis (x, -y)."""

  short, tag, bucket = "grid", "G", "spatial"
  body_chars = MOVES
  answer_chars = DIGITS + "- "
  levels = tuple(range(1, 9))

  def draw(self, rng, level):
    return ("".join(rng.choice(MOVES) for _ in range(_moves(level))),)

  def render(self, z):
    return z[0]

  def solve(self, z):
    x, y = core.walk(z[0])[-1]
    return f"{x} {y}"

  def wrong(self, z):
    x, y = core.walk(z[0])[-1]
    return f"{x} {-y}"

  def max_body_chars(self, level):
    return _moves(level)

  def max_answer_chars(self, level):
    n = _moves(level)
    return max(len(str(-x)) + 1 + len(str(-(n - x))) for x in range(n + 1))


class Manhattan(core.TaskEnv):
  """``H12 5>7 30=`` -> ``30`` (|x1-x2| + |y1-y2|). Level 1..6: coordinates in
  [0, R) with R = 4, 8, 16, 32, 100, 1000. Systematic mistake: the larger of |dx| and |dy|."""

  short, tag, bucket = "manhattan", "H", "spatial"
  body_chars = DIGITS + " >"
  answer_chars = DIGITS
  levels = tuple(range(1, 7))

  def draw(self, rng, level):
    r = MANHATTAN_RANGES[level - 1]
    return tuple(rng.randrange(r) for _ in range(4))

  def render(self, z):
    x1, y1, x2, y2 = z
    return f"{x1} {y1}>{x2} {y2}"

  def solve(self, z):
    x1, y1, x2, y2 = z
    return str(abs(x1 - x2) + abs(y1 - y2))

  def wrong(self, z):
    x1, y1, x2, y2 = z
    return str(max(abs(x1 - x2), abs(y1 - y2)))

  def max_body_chars(self, level):
    return 4 * len(str(MANHATTAN_RANGES[level - 1] - 1)) + 3

  def max_answer_chars(self, level):
    return len(str(2 * (MANHATTAN_RANGES[level - 1] - 1)))


class Visits(core.TaskEnv):
  """``YURDLU=`` -> ``4`` (distinct cells visited, start included). Level 1..8: 2*level+2
  moves. Systematic mistake: assume no cell is visited twice (moves + 1)."""

  short, tag, bucket = "visits", "Y", "spatial"
  body_chars = MOVES
  answer_chars = DIGITS
  levels = tuple(range(1, 9))

  def draw(self, rng, level):
    return ("".join(rng.choice(MOVES) for _ in range(_moves(level))),)

  def render(self, z):
    return z[0]

  def solve(self, z):
    return str(len(set(core.walk(z[0]))))

  def wrong(self, z):
    return str(len(z[0]) + 1)

  def max_body_chars(self, level):
    return _moves(level)

  def max_answer_chars(self, level):
    return len(str(_moves(level) + 1))
