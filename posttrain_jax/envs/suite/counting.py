"""Bucket 'counting': occurrences of a symbol, distinct symbols, runs."""

from posttrain_jax.envs.suite import core
from posttrain_jax.envs.suite.core import DIGITS, LETTERS


def _length(level: int) -> int:
  return 2 * level + 2


def _runs(s: str) -> int:
  return sum(1 for i, ch in enumerate(s) if i == 0 or s[i - 1] != ch)


class Count(core.TaskEnv):
  """``Cb:abcabba=`` -> ``3`` (how many times the symbol before ':' occurs after it). Level 1..8:
  string length 2*level+2 over the first min(level+2, 6) letters. Systematic mistake: count the
  runs of the symbol instead of its occurrences."""

  short, tag, bucket = "count", "C", "counting"
  body_chars = LETTERS[:6] + ":"
  answer_chars = DIGITS
  levels = tuple(range(1, 9))

  def draw(self, rng, level):
    alphabet = LETTERS[: min(level + 2, 6)]
    s = "".join(rng.choice(alphabet) for _ in range(_length(level)))
    return (s, rng.choice(alphabet))

  def render(self, z):
    s, q = z
    return f"{q}:{s}"

  def solve(self, z):
    s, q = z
    return str(s.count(q))

  def wrong(self, z):
    s, q = z
    return str(sum(1 for i, ch in enumerate(s) if ch == q and (i == 0 or s[i - 1] != q)))

  def max_body_chars(self, level):
    return _length(level) + 2

  def max_answer_chars(self, level):
    return len(str(_length(level)))


class Distinct(core.TaskEnv):
  """``Kabcabba=`` -> ``3`` (number of distinct symbols). Level 1..8: length 2*level+2 over the
  first min(level+2, 8) letters. Systematic mistake: count the symbols that occur exactly once."""

  short, tag, bucket = "distinct", "K", "counting"
  body_chars = LETTERS
  answer_chars = DIGITS
  levels = tuple(range(1, 9))

  def draw(self, rng, level):
    alphabet = LETTERS[: min(level + 2, 8)]
    return ("".join(rng.choice(alphabet) for _ in range(_length(level))),)

  def render(self, z):
    return z[0]

  def solve(self, z):
    return str(len(set(z[0])))

  def wrong(self, z):
    return str(sum(1 for ch in set(z[0]) if z[0].count(ch) == 1))

  def max_body_chars(self, level):
    return _length(level)

  def max_answer_chars(self, level):
    return 1


class Runs(core.TaskEnv):
  """``Zaabbba=`` -> ``3`` (number of maximal runs of equal symbols). Level 1..8: length
  2*level+2, 3 letters up to level 3 and 4 after, each symbol repeating the previous one with
  probability 0.4. Systematic mistake: count the changes (runs - 1, the fencepost error)."""

  short, tag, bucket = "runs", "Z", "counting"
  body_chars = LETTERS[:4]
  answer_chars = DIGITS
  levels = tuple(range(1, 9))

  def draw(self, rng, level):
    alphabet = LETTERS[: 3 if level <= 3 else 4]
    return (core.sticky_string(rng, _length(level), alphabet, stay=0.4),)

  def render(self, z):
    return z[0]

  def solve(self, z):
    return str(_runs(z[0]))

  def wrong(self, z):
    return str(_runs(z[0]) - 1)

  def max_body_chars(self, level):
    return _length(level)

  def max_answer_chars(self, level):
    return len(str(_length(level)))
