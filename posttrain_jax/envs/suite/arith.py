"""Bucket 'math': subtraction, multiplication by a digit, modular sums."""

from posttrain_jax.envs.suite import core
from posttrain_jax.envs.suite.core import DIGITS


class Sub(core.TaskEnv):
  """``S0472-0815=`` -> ``-343``. Level = digits per (zero-padded) operand, 1..6; the answer may
  be negative. Systematic mistake: subtract digit by digit forgetting every borrow."""

  short, tag, bucket = "sub", "S", "math"
  body_chars = DIGITS + "-"
  answer_chars = DIGITS + "-"
  levels = tuple(range(1, 7))

  def draw(self, rng, level):
    hi = 10**level
    return (level, rng.randrange(hi), rng.randrange(hi))

  def render(self, z):
    w, a, b = z
    return f"{a:0{w}d}-{b:0{w}d}"

  def solve(self, z):
    return str(z[1] - z[2])

  def wrong(self, z):
    w, a, b = z
    big, small = max(a, b), min(a, b)
    digits = [(int(x) - int(y)) % 10 for x, y in zip(f"{big:0{w}d}", f"{small:0{w}d}")]
    value = int("".join(map(str, digits)))
    return str(-value if a < b else value)

  def max_body_chars(self, level):
    return 2 * level + 1

  def max_answer_chars(self, level):
    return level + 1


class Mul(core.TaskEnv):
  """``M0482*7=`` -> ``3374``. Level = digits of the (zero-padded) multiplicand, 1..6; the
  multiplier is a digit 2..9. Systematic mistake: multiply digit by digit forgetting carries."""

  short, tag, bucket = "mul", "M", "math"
  body_chars = DIGITS + "*"
  answer_chars = DIGITS
  levels = tuple(range(1, 7))

  def draw(self, rng, level):
    return (level, rng.randrange(10**level), rng.randrange(2, 10))

  def render(self, z):
    w, a, k = z
    return f"{a:0{w}d}*{k}"

  def solve(self, z):
    return str(z[1] * z[2])

  def wrong(self, z):
    w, a, k = z
    return str(int("".join(str(int(d) * k % 10) for d in f"{a:0{w}d}")))

  def max_body_chars(self, level):
    return level + 2

  def max_answer_chars(self, level):
    return level + 1


class ModSum(core.TaskEnv):
  """``Q3+8+5%7=`` -> ``2`` (the sum of one-digit terms modulo 2..9). Level = number of terms
  minus one, 1..7. Systematic mistake: reduce modulo 10 instead (the last digit of the sum)."""

  short, tag, bucket = "modsum", "Q", "math"
  body_chars = DIGITS + "+%"
  answer_chars = DIGITS
  levels = tuple(range(1, 8))

  def draw(self, rng, level):
    terms = tuple(rng.randrange(10) for _ in range(level + 1))
    return (terms, rng.randrange(2, 10))

  def render(self, z):
    terms, m = z
    return "+".join(map(str, terms)) + f"%{m}"

  def solve(self, z):
    return str(sum(z[0]) % z[1])

  def wrong(self, z):
    return str(sum(z[0]) % 10)

  def max_body_chars(self, level):
    return 2 * (level + 1) - 1 + 2

  def max_answer_chars(self, level):
    return 1
