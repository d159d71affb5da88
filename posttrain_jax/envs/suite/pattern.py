"""Bucket 'pattern': arithmetic progressions, periodic sequences, reversal."""

from posttrain_jax.envs.suite import core
from posttrain_jax.envs.suite.core import DIGITS, LETTERS

SHOWN_TERMS = 3
PROGRESSION_STARTS = (20, 40, 100, 200, 500, 1000)
PROGRESSION_STEPS = (4, 8, 12, 25, 50, 99)


def _progression_bounds(level: int) -> tuple[int, int, bool]:
  """(start range, largest |step|, negative steps allowed)."""
  return PROGRESSION_STARTS[level - 1], PROGRESSION_STEPS[level - 1], level >= 3


def _has_period(s: str, q: int) -> bool:
  return all(s[i] == s[i + q] for i in range(len(s) - q))


class Progression(core.TaskEnv):
  """``P12 19 26=`` -> ``33`` (the next term). Level 1..6: start in [0, S), |step| in [1, M] with
  S = 20, 40, 100, 200, 500, 1000 and M = 4, 8, 12, 25, 50, 99; steps may be negative from
  level 3. Systematic mistake: skip a term (start + 4 step)."""

  short, tag, bucket = "progression", "P", "pattern"
  body_chars = DIGITS + "- "
  answer_chars = DIGITS + "-"
  levels = tuple(range(1, 7))

  def draw(self, rng, level):
    starts, max_step, negative = _progression_bounds(level)
    step = rng.randint(1, max_step)
    if negative and rng.random() < 0.5:
      step = -step
    return (rng.randrange(starts), step)

  def render(self, z):
    a, s = z
    return " ".join(str(a + i * s) for i in range(SHOWN_TERMS))

  def solve(self, z):
    return str(z[0] + SHOWN_TERMS * z[1])

  def wrong(self, z):
    return str(z[0] + (SHOWN_TERMS + 1) * z[1])

  def _width(self, level):
    starts, max_step, negative = _progression_bounds(level)
    lo = -SHOWN_TERMS * max_step if negative else 0
    return core.int_width(lo, starts - 1 + SHOWN_TERMS * max_step)

  def max_body_chars(self, level):
    return SHOWN_TERMS * self._width(level) + SHOWN_TERMS - 1

  def max_answer_chars(self, level):
    return self._width(level)


class Repeat(core.TaskEnv):
  """``Nabcabcab=`` -> ``c`` (the next symbol of a periodic sequence). Level 1..6: period
  level+1 over 8 letters; at least two full periods are shown, and the shown string has no
  shorter period, so the continuation is unique. Systematic mistake: restart the sequence
  (answer its first symbol)."""

  short, tag, bucket = "repeat", "N", "pattern"
  body_chars = LETTERS
  answer_chars = LETTERS
  levels = tuple(range(1, 7))

  def draw(self, rng, level):
    p = level + 1
    while True:
      unit = "".join(rng.choice(LETTERS) for _ in range(p))
      length = 2 * p + rng.randrange(p)
      shown = (unit * 3)[:length]
      if not any(_has_period(shown, q) for q in range(1, p)):
        return (unit, length)

  def render(self, z):
    unit, length = z
    return (unit * 3)[:length]

  def solve(self, z):
    unit, length = z
    return unit[length % len(unit)]

  def wrong(self, z):
    return z[0][0]

  def max_body_chars(self, level):
    return 3 * (level + 1) - 1

  def max_answer_chars(self, level):
    return 1


class Reverse(core.TaskEnv):
  """``Vabcde=`` -> ``edcba``. Level 1..7: length level+1 over 8 letters. Systematic mistake:
  copy the string unchanged."""

  short, tag, bucket = "reverse", "V", "pattern"
  body_chars = LETTERS
  answer_chars = LETTERS
  levels = tuple(range(1, 8))

  def draw(self, rng, level):
    return ("".join(rng.choice(LETTERS) for _ in range(level + 1)),)

  def render(self, z):
    return z[0]

  def solve(self, z):
    return z[0][::-1]

  def wrong(self, z):
    return z[0]

  def max_body_chars(self, level):
    return level + 1

  def max_answer_chars(self, level):
    return level + 1
