"""Bucket 'logic': maximum of a list, sorting digits, boolean expressions, parity."""

from posttrain_jax.envs.suite import core
from posttrain_jax.envs.suite.core import DIGITS

BOOL_MAX_BODY = 21
NOT_PROB = 0.25


class Max(core.TaskEnv):
  """``X3 19 4 7=`` -> ``19``. Level 1..6: level+1 numbers of up to 1 (levels 1-2) or 2 digits.
  Systematic mistake: compare the numbers as strings (``9`` beats ``19``)."""

  short, tag, bucket = "max", "X", "logic"
  body_chars = DIGITS + " "
  answer_chars = DIGITS
  levels = tuple(range(1, 7))

  @staticmethod
  def _width(level):
    return 1 if level <= 2 else 2

  def draw(self, rng, level):
    return tuple(rng.randrange(10 ** self._width(level)) for _ in range(level + 1))

  def render(self, z):
    return " ".join(map(str, z))

  def solve(self, z):
    return str(max(z))

  def wrong(self, z):
    return max(map(str, z))

  def max_body_chars(self, level):
    return (level + 1) * self._width(level) + level

  def max_answer_chars(self, level):
    return self._width(level)


class Sort(core.TaskEnv):
  """``O31415=`` -> ``11345`` (the digits in ascending order). Level 1..7: level+1 digits.
  Systematic mistake: drop repeated digits."""

  short, tag, bucket = "sort", "O", "logic"
  body_chars = DIGITS
  answer_chars = DIGITS
  levels = tuple(range(1, 8))

  def draw(self, rng, level):
    return ("".join(rng.choice(DIGITS) for _ in range(level + 1)),)

  def render(self, z):
    return z[0]

  def solve(self, z):
    return "".join(sorted(z[0]))

  def wrong(self, z):
    return "".join(sorted(set(z[0])))

  def max_body_chars(self, level):
    return level + 1

  def max_answer_chars(self, level):
    return level + 1


def _bool_tree(rng, leaves: int, negate_groups: bool) -> tuple[str, str | None]:
  """Random expression over 0/1 with & and |; parenthesises an | under an & (precedence
  ! > & > |), optionally negating parenthesised groups. Returns (text, top operator)."""
  if leaves == 1:
    bit = str(rng.randrange(2))
    return ("!" + bit if rng.random() < NOT_PROB else bit), None
  k = rng.randrange(1, leaves)
  op = rng.choice("&|")
  parts = []
  for text, child_op in (
    _bool_tree(rng, k, negate_groups),
    _bool_tree(rng, leaves - k, negate_groups),
  ):
    if op == "&" and child_op == "|":
      text = f"({text})"
      if negate_groups and rng.random() < NOT_PROB:
        text = "!" + text
    parts.append(text)
  return op.join(parts), op


def bool_eval(text: str, precedence: bool = True) -> int:
  """Value of a generated boolean expression; ``precedence=False`` reads & and | strictly
  left to right (the systematic mistake). Parentheses and ! are honoured either way."""
  pos = 0

  def atom():
    nonlocal pos
    ch = text[pos]
    pos += 1
    if ch == "!":
      return 1 - atom()
    if ch == "(":
      value = expr()
      pos += 1  # the ')'
      return value
    return int(ch)

  def conj():
    nonlocal pos
    value = atom()
    while pos < len(text) and text[pos] == "&":
      pos += 1
      value &= atom()
    return value

  def expr():
    nonlocal pos
    value = conj() if precedence else atom()
    while pos < len(text) and text[pos] in ("|" if precedence else "&|"):
      op = text[pos]
      pos += 1
      rhs = conj() if precedence else atom()
      value = value | rhs if op == "|" else value & rhs
    return value

  return expr()


class Bool(core.TaskEnv):
  """``B1|!0&(0|1)=`` -> ``1`` (! binds tightest, then &, then |). Level 1..6: level+2 operands;
  level 1 is a flat chain, level 2 up random trees with parentheses, level 4 up negated groups;
  at most 21 characters. Systematic mistake: evaluate & and | left to right."""

  short, tag, bucket = "bool", "B", "logic"
  body_chars = "01&|!()"
  answer_chars = "01"
  levels = tuple(range(1, 7))

  def draw(self, rng, level):
    leaves = level + 2
    while True:
      if level == 1:
        bits = [_bool_tree(rng, 1, False)[0] for _ in range(leaves)]
        text = bits[0] + "".join(rng.choice("&|") + b for b in bits[1:])
      else:
        text = _bool_tree(rng, leaves, negate_groups=level >= 4)[0]
      if len(text) <= self.max_body_chars(level):
        return (text,)

  def render(self, z):
    return z[0]

  def solve(self, z):
    return str(bool_eval(z[0]))

  def wrong(self, z):
    return str(bool_eval(z[0], precedence=False))

  def max_body_chars(self, level):
    leaves = level + 2
    groups = 0 if level == 1 else (leaves - 2) * (3 if level >= 4 else 2)
    return min(BOOL_MAX_BODY, 2 * leaves + leaves - 1 + groups)

  def max_answer_chars(self, level):
    return 1


class Parity(core.TaskEnv):
  """``E1011001=`` -> ``0`` (1 iff the number of ones is odd). Level 1..8: 2*level+4 bits.
  Systematic mistake: answer the last bit."""

  short, tag, bucket = "parity", "E", "logic"
  body_chars = "01"
  answer_chars = "01"
  levels = tuple(range(1, 9))

  def draw(self, rng, level):
    return ("".join(rng.choice("01") for _ in range(2 * level + 4)),)

  def render(self, z):
    return z[0]

  def solve(self, z):
    return str(z[0].count("1") % 2)

  def wrong(self, z):
    return z[0][-1]

  def max_body_chars(self, level):
    return 2 * level + 4

  def max_answer_chars(self, level):
    return 1
