"""Write code that passes hidden tests: infer a small integer function from examples.

Prompt ``"2=7 5=16 9=28 11=34:"``: four input/output examples of an unknown function of one
integer ``a``; the completion is the function's body, a Python expression in ``a`` (``"3*a+1"``,
or any equivalent: ``"a*3+1"``, ``"1+a+a+a"``). It is scored by running
``def f(a): return (<completion>)`` in the code sandbox (:mod:`posttrain_jax.rewards.sandbox`)
on eight hidden inputs, comparing outside the sandbox (:mod:`posttrain_jax.rewards.code_tests`):
1.0 iff all eight pass. ``problem.data`` is ``(template, entry, cases, family, params,
shown)``, so the ``code_tests`` reward term (the pass fraction) scores these problems too.

Levels (cumulative: level L draws among the families of levels 1..L):

1. ``a+c``, ``a-c``, ``a*c``;
2. ``c*a+d``, ``a*a+c``, ``c-a``;
3. ``a%c``, ``a//c``, ``(a%c)*d``;
4. ``(a>c)*d``, ``a*a-c*a``, ``(a+c)%d``.

Shown inputs lie in 0..15, hidden ones in 0..24 (disjoint from the shown); a problem's shown
examples are drawn until they determine the function among all of its level's families (every
family member that fits the examples agrees with it on the hidden inputs), so each prompt has
one right answer up to equivalence. The characters (digits, ``a``, ``+-*/%()>=:`` and space)
all belong to the shared tokenizer character set.

How hard it is (pretraining runs): docs/envs.md.

Cost: one sandbox process per completion (its wall time: docs/sandbox.md); a completion that does not compile scores 0 without one.
"""

import functools
import itertools

import jax
import numpy as np

from posttrain_jax.envs import base
from posttrain_jax.rewards import code_tests, sandbox

NAME = "code"
CHARS = "0123456789 =:a+-*/%()>"
LEVELS = (1, 2, 3, 4)
SHOWN, HIDDEN = 4, 8
SHOWN_RANGE, HIDDEN_RANGE = 16, 25
TEMPLATE = "def f(a):\n  return ({completion})\n"
ENTRY = "f"

# family -> (level, python function of (a, *params), parameter ranges)
FAMILIES = {
  "a+{0}": (1, lambda a, c: a + c, (range(1, 10),)),
  "a-{0}": (1, lambda a, c: a - c, (range(1, 10),)),
  "a*{0}": (1, lambda a, c: a * c, (range(2, 10),)),
  "{0}*a+{1}": (2, lambda a, c, d: c * a + d, (range(2, 6), range(1, 10))),
  "a*a+{0}": (2, lambda a, c: a * a + c, (range(0, 10),)),
  "{0}-a": (2, lambda a, c: c - a, (range(0, 10),)),
  "a%{0}": (3, lambda a, c: a % c, (range(2, 7),)),
  "a//{0}": (3, lambda a, c: a // c, (range(2, 6),)),
  "(a%{0})*{1}": (3, lambda a, c, d: (a % c) * d, (range(2, 5), range(2, 6))),
  "(a>{0})*{1}": (4, lambda a, c, d: (a > c) * d, (range(2, 10), range(2, 10))),
  "a*a-{0}*a": (4, lambda a, c: a * a - c * a, (range(2, 6),)),
  "(a+{0})%{1}": (4, lambda a, c, d: (a + c) % d, (range(1, 6), range(3, 8))),
}


@functools.lru_cache(maxsize=None)
def members(level: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
  """Every ``(family, params)`` of the levels 1..``level``."""
  return tuple(
    (family, params)
    for family, (lvl, _, ranges) in FAMILIES.items()
    if lvl <= level
    for params in itertools.product(*ranges)
  )


def evaluate(family: str, params, a: int) -> int:
  """The value of ``family`` with ``params`` at ``a`` (computed here, never by ``eval``)."""
  return int(FAMILIES[family][1](a, *params))


def expression(family: str, params) -> str:
  return family.format(*params)


class Code(base.GeneratedEnv):
  """Infer a small integer function from four examples; write it as a Python expression."""

  name = NAME
  chars = CHARS
  levels = LEVELS

  def __init__(self, eval_percent: int = 10, limits: sandbox.Limits | None = None):
    self.eval_percent = eval_percent
    self.limits = limits

  @functools.lru_cache(maxsize=None)
  def max_prompt_chars(self, level: int) -> int:
    widths = sorted(
      (max(len(str(evaluate(f, p, a))) for a in range(SHOWN_RANGE)) for f, p in members(level))
    )
    return SHOWN * (2 + 1 + widths[-1] + 1)

  @functools.lru_cache(maxsize=None)
  def max_answer_chars(self, level: int) -> int:
    return max(len(expression(f, p)) for f, p in members(level))

  def make(self, family: str, params, shown, hidden, level: int) -> base.Problem:
    """The problem of ``family`` with ``params``, shown inputs ``shown`` and hidden ones
    ``hidden``; ValueError when they are not a valid level-``level`` problem."""
    self._check_level(level)
    params, shown, hidden = tuple(params), tuple(shown), tuple(hidden)
    if (
      family not in FAMILIES
      or FAMILIES[family][0] > level
      or (family, params) not in members(level)
    ):
      raise ValueError(f"code level {level} has no function {family!r} with {params}")
    if (
      len(shown) != SHOWN
      or len(set(shown)) != SHOWN
      or len(hidden) != HIDDEN
      or len(set(hidden)) != HIDDEN
      or set(shown) & set(hidden)
      or not all(0 <= a < SHOWN_RANGE for a in shown)
      or not all(0 <= a < HIDDEN_RANGE for a in hidden)
    ):
      raise ValueError(
        f"code needs {SHOWN} distinct shown inputs in 0..{SHOWN_RANGE - 1} and "
        f"{HIDDEN} distinct other hidden inputs in 0..{HIDDEN_RANGE - 1}, got "
        f"{shown} and {hidden}"
      )
    prompt = " ".join(f"{a}={evaluate(family, params, a)}" for a in shown) + ":"
    cases = tuple(((a,), evaluate(family, params, a)) for a in hidden)
    return base.Problem(
      prompt=prompt,
      answer=expression(family, params),
      env=NAME,
      level=level,
      uid=prompt,
      data=(TEMPLATE, ENTRY, cases, family, params, shown),
    )

  @staticmethod
  def determined(family, params, shown, hidden, level: int) -> bool:
    """Whether every level-``level`` function that fits the shown examples agrees with
    ``family(params)`` on the hidden inputs."""
    want = [evaluate(family, params, a) for a in shown]
    truth = [evaluate(family, params, a) for a in hidden]
    return all(
      [evaluate(f, p, a) for a in hidden] == truth
      for f, p in members(level)
      if [evaluate(f, p, a) for a in shown] == want
    )

  def _draw(self, rng: np.random.Generator, level: int) -> base.Problem:
    pool = members(level)
    family, params = pool[int(rng.integers(len(pool)))]
    for _ in range(100):
      shown = sorted(int(a) for a in rng.choice(SHOWN_RANGE, SHOWN, replace=False))
      rest = [a for a in range(HIDDEN_RANGE) if a not in shown]
      hidden = sorted(int(a) for a in rng.choice(rest, HIDDEN, replace=False))
      if self.determined(family, params, shown, hidden, level):
        return self.make(family, params, shown, hidden, level)
    return self._draw(rng, level)  # examples that never pin it down: another function

  def rebuild(self, problem: base.Problem) -> base.Problem:
    """The problem regenerated from its ``data`` (family, parameters, shown and hidden
    inputs)."""
    _, _, cases, family, params, shown = problem.data
    return self.make(family, params, shown, [args[0] for args, _ in cases], problem.level)

  def verify(self, problem: base.Problem, completion) -> float:
    """1.0 iff ``def f(a): return (<completion>)`` passes all hidden tests in the sandbox."""
    if not isinstance(completion, str) or not completion.strip():
      return 0.0
    return code_tests.verify(problem, completion.strip(), self.limits)

  def corrupt(self, problem: base.Problem, rng: np.random.Generator) -> str:
    """A plausible wrong answer: another function of the level that fails a hidden test."""
    pool = members(problem.level)
    cases = problem.data[2]
    while True:
      family, params = pool[int(rng.integers(len(pool)))]
      if any(evaluate(family, params, args[0]) != want for args, want in cases):
        return expression(family, params)

  def corpus(self, key, n: int, *, level: int, noise: float = 0.0) -> list[tuple[str, str]]:
    """``n`` (prompt, answer) pretraining pairs from the train split; a fraction ``noise`` of
    the answers replaced by a wrong one (``corrupt``)."""
    if not 0.0 <= noise <= 1.0:
      raise ValueError(f"corpus noise must lie in [0, 1], got {noise}")
    problems = self.sample(key, n, level=level, split="train")
    rng = base.numpy_rng(jax.random.fold_in(key, 1))
    return [
      (p.prompt, self.corrupt(p, rng) if rng.random() < noise else p.answer) for p in problems
    ]
