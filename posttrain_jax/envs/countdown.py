"""Countdown: reach a target from given numbers with + - * / and parentheses.

Prompt ``"3 5 12>21:"``; a completion such as ``"(12-5)*3"`` is correct iff it uses each given
number exactly once and evaluates exactly (rational arithmetic) to the target. The verifier
parses the expression itself with a small recursive-descent parser: never ``eval``/``exec``.
Level = how many numbers are given (2 to 5).
"""

from fractions import Fraction

import jax
import numpy as np

from posttrain_jax.envs import base

NAME = "countdown"
CHARS = "0123456789+-*/() >:"
LEVELS = (2, 3, 4, 5)
MAX_NUMBER = 20
MAX_TARGET = 200
MAX_COMPLETION_CHARS = 128
_OPS = "+-*/"


class _ParseError(ValueError):
  pass


class _Parser:
  """expr := term (('+'|'-') term)* ; term := factor (('*'|'/') factor)* ;
  factor := INT | '(' expr ')'. Collects the integer literals it reads."""

  def __init__(self, text: str):
    self.tokens = self._lex(text)
    self.pos = 0
    self.numbers: list[int] = []
    self.depth = 0

  @staticmethod
  def _lex(text: str) -> list:
    tokens, i = [], 0
    while i < len(text):
      ch = text[i]
      if ch.isspace():
        i += 1
      elif ch.isdigit():
        j = i
        while j < len(text) and text[j].isdigit():
          j += 1
        if j - i > 6:
          raise _ParseError("number too long")
        tokens.append(int(text[i:j]))
        i = j
      elif ch in "+-*/()":
        tokens.append(ch)
        i += 1
      else:
        raise _ParseError(f"unexpected character {ch!r}")
    return tokens

  def _peek(self):
    return self.tokens[self.pos] if self.pos < len(self.tokens) else None

  def _take(self):
    tok = self._peek()
    self.pos += 1
    return tok

  def parse(self) -> Fraction:
    if not self.tokens:
      raise _ParseError("empty expression")
    value = self._expr()
    if self.pos != len(self.tokens):
      raise _ParseError("trailing tokens")
    return value

  def _expr(self) -> Fraction:
    value = self._term()
    while self._peek() in ("+", "-"):
      op, rhs = self._take(), self._term()
      value = value + rhs if op == "+" else value - rhs
    return value

  def _term(self) -> Fraction:
    value = self._factor()
    while self._peek() in ("*", "/"):
      op, rhs = self._take(), self._factor()
      if op == "*":
        value = value * rhs
      elif rhs == 0:
        raise _ParseError("division by zero")
      else:
        value = value / rhs
    return value

  def _factor(self) -> Fraction:
    tok = self._take()
    if isinstance(tok, int):
      self.numbers.append(tok)
      return Fraction(tok)
    if tok == "(":
      self.depth += 1
      if self.depth > 32:
        raise _ParseError("nesting too deep")
      value = self._expr()
      if self._take() != ")":
        raise _ParseError("missing ')'")
      self.depth -= 1
      return value
    raise _ParseError(f"unexpected token {tok!r}")


def evaluate(expression: str) -> tuple[Fraction, list[int]]:
  """(exact value, integer literals used) of an arithmetic expression; ValueError if malformed."""
  parser = _Parser(expression)
  return parser.parse(), parser.numbers


def _random_expression(rng: np.random.Generator, numbers: list[int]):
  """A random expression over all ``numbers`` whose every intermediate value is a positive
  integer (the classic Countdown rule). Returns (text, value) or None."""
  items = [(str(x), x, True) for x in numbers]  # (text, value, atomic)
  while len(items) > 1:
    i, j = rng.choice(len(items), size=2, replace=False)
    (ta, va, aa), (tb, vb, ab) = items[i], items[j]
    op = _OPS[rng.integers(4)]
    if op == "-" and va <= vb:
      (ta, va, aa), (tb, vb, ab) = (tb, vb, ab), (ta, va, aa)
    if op == "-" and va == vb:
      return None
    if op == "/" and (vb == 0 or va % vb):
      return None
    value = {"+": va + vb, "-": va - vb, "*": va * vb, "/": va // vb if vb else 0}[op]
    wrap = lambda t, atomic: t if atomic else f"({t})"
    text = f"{wrap(ta, aa)}{op}{wrap(tb, ab)}"
    items = [x for k, x in enumerate(items) if k not in (i, j)] + [(text, value, False)]
  return items[0][0], items[0][1]


class Countdown:
  """Use every given number exactly once to reach the target."""

  name = NAME
  chars = CHARS
  levels = LEVELS

  def __init__(self, eval_percent: int = 10):
    self.eval_percent = eval_percent

  def max_prompt_chars(self, level: int) -> int:
    return 3 * level + len(str(MAX_TARGET)) + 1

  def max_answer_chars(self, level: int) -> int:
    return 2 * level + (level - 1) + 2 * (level - 1)

  def _draw(self, rng: np.random.Generator, level: int) -> base.Problem:
    while True:
      numbers = [int(x) for x in rng.integers(1, MAX_NUMBER, size=level)]
      made = _random_expression(rng, numbers)
      if made is None or not 1 <= made[1] <= MAX_TARGET:
        continue
      nums = " ".join(str(x) for x in numbers)
      uid = " ".join(str(x) for x in sorted(numbers)) + f">{made[1]}"
      return base.Problem(
        prompt=f"{nums}>{made[1]}:",
        answer=made[0],
        env=NAME,
        level=level,
        uid=uid,
        data=(tuple(numbers), made[1]),
      )

  def sample(self, key, n: int, *, level: int, split: str = "train") -> list[base.Problem]:
    if level not in LEVELS:
      raise ValueError(f"countdown level must be one of {LEVELS}, got {level}")
    rng = base.numpy_rng(key)
    return base.sample_until(rng, n, lambda r: self._draw(r, level), split, self.eval_percent)

  def verify(self, problem: base.Problem, completion: str) -> float:
    """1.0 iff the completion uses each given number exactly once and equals the target."""
    if not isinstance(completion, str) or len(completion) > MAX_COMPLETION_CHARS:
      return 0.0
    numbers, target = problem.data
    try:
      value, used = evaluate(completion)
    except ValueError:
      return 0.0
    return float(sorted(used) == sorted(numbers) and value == target)

  def corpus(self, key, n: int, *, level: int, noise: float = 0.0) -> list[tuple[str, str]]:
    """``n`` (prompt, solution) pairs from the train split; a fraction ``noise`` of solutions
    is replaced by a random expression over the same numbers (usually wrong)."""
    problems = self.sample(key, n, level=level, split="train")
    rng = base.numpy_rng(jax.random.fold_in(key, 1))
    out = []
    for p in problems:
      completion = p.answer
      if noise and rng.random() < noise:
        made = None
        while made is None:
          made = _random_expression(rng, list(p.data[0]))
        completion = made[0]
      out.append((p.prompt, completion))
    return out
