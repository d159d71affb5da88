"""Digits with a given sum: many correct answers per prompt (TS-OPSD's toy, methods_B.md section 2).

Prompt ``"4:17="``: write ``n = 4`` digits (leading zeros allowed) whose sum is ``S = 17``; any
such string is correct (``"9800"``, ``"4517"``, ...), so a policy's diversity is measurable as its
number of distinct correct answers out of ``num_solutions``. The reference answer is the
largest one (nines first), the pretraining corpus draws uniformly among all correct answers.

Level ``L`` (3 to 8): ``n`` uniform in 2..L, ``S`` uniform in 1..9n-1 (at least n answers).
The pools are small (level 5: 122 prompts, 15 of them in the eval split; level 3: 43 and 3):
the task is about how many answers a policy finds, not about generalising to unseen prompts.

How hard it is (pretraining runs): docs/envs.md.
"""

import functools

import jax
import numpy as np

from posttrain_jax.envs import base

NAME = "digit_sum"
CHARS = "0123456789:="
LEVELS = tuple(range(3, 9))


@functools.lru_cache(maxsize=None)
def count(n: int, total: int) -> int:
  """How many strings of ``n`` digits sum to ``total``."""
  if n == 0:
    return int(total == 0)
  return sum(count(n - 1, total - d) for d in range(10) if d <= total)


class DigitSum(base.GeneratedEnv):
  """Write ``n`` digits summing to ``S``."""

  name = NAME
  chars = CHARS
  levels = LEVELS

  def __init__(self, eval_percent: int = 10):
    self.eval_percent = eval_percent

  def max_prompt_chars(self, level: int) -> int:
    return len(f"{level}:{9 * level}=")

  def max_answer_chars(self, level: int) -> int:
    return level

  def make(self, n: int, total: int, level: int) -> base.Problem:
    if not 2 <= n <= level or not 0 <= total <= 9 * n:
      raise ValueError(
        f"digit_sum needs 2 <= n <= level={level} and 0 <= S <= 9n, got n={n}, S={total}"
      )
    answer = "".join(str(min(9, total - 9 * i)) if total > 9 * i else "0" for i in range(n))
    prompt = f"{n}:{total}="
    return base.Problem(
      prompt=prompt, answer=answer, env=NAME, level=level, uid=prompt, data=(n, total)
    )

  def _draw(self, rng: np.random.Generator, level: int) -> base.Problem:
    n = int(rng.integers(2, level + 1))
    return self.make(n, int(rng.integers(1, 9 * n)), level)

  def rebuild(self, problem: base.Problem) -> base.Problem:
    """The problem regenerated from ``(n, S)`` (``data``, else the prompt ``n:S=``)."""
    self._check_level(problem.level)
    if problem.data:
      n, total = problem.data
    else:
      n, _, total = problem.prompt.removesuffix("=").partition(":")
    return self.make(int(n), int(total), problem.level)

  def verify(self, problem: base.Problem, completion: str) -> float:
    """1.0 iff the completion (whitespace-stripped) is ``n`` digits summing to ``S``."""
    if not isinstance(completion, str):
      return 0.0
    digits = completion.strip()
    n, total = problem.data
    ok = len(digits) == n and digits.isascii() and digits.isdigit()
    return float(ok and sum(int(c) for c in digits) == total)

  def num_solutions(self, problem: base.Problem) -> int:
    return count(*problem.data)

  def solutions(self, problem: base.Problem, limit: int = 100_000) -> list[str]:
    """Every correct completion, sorted; ValueError when there are more than ``limit``."""
    n, total = problem.data
    if count(n, total) > limit:
      raise ValueError(f"{problem.prompt!r} has {count(n, total)} answers, over limit={limit}")
    out = []

    def extend(prefix, left):
      if len(prefix) == n:
        out.append(prefix)
        return
      for d in range(10):
        if count(n - len(prefix) - 1, left - d):
          extend(prefix + str(d), left - d)

    extend("", total)
    return out

  def uniform_solution(self, problem: base.Problem, rng: np.random.Generator) -> str:
    """A correct answer drawn uniformly among all of them (digit by digit, each digit with the
    probability of the answers that continue it)."""
    n, left = problem.data
    out = ""
    for i in range(n):
      weights = np.array(
        [count(n - i - 1, left - d) if d <= left else 0 for d in range(10)], np.float64
      )
      d = int(rng.choice(10, p=weights / weights.sum()))
      out, left = out + str(d), left - d
    return out

  def corrupt(self, problem: base.Problem, rng: np.random.Generator) -> str:
    """A plausible wrong answer: ``n`` random digits whose sum misses ``S``."""
    n, _ = problem.data
    while True:
      attempt = "".join(str(d) for d in rng.integers(10, size=n))
      if not self.verify(problem, attempt):
        return attempt

  def corpus(self, key, n: int, *, level: int, noise: float = 0.0) -> list[tuple[str, str]]:
    """``n`` (prompt, answer) pretraining pairs from the train split, each answer uniform among
    the correct ones; a fraction ``noise`` replaced by a wrong one (``corrupt``)."""
    if not 0.0 <= noise <= 1.0:
      raise ValueError(f"corpus noise must lie in [0, 1], got {noise}")
    problems = self.sample(key, n, level=level, split="train")
    rng = base.numpy_rng(jax.random.fold_in(key, 1))
    return [
      (p.prompt, self.corrupt(p, rng) if rng.random() < noise else self.uniform_solution(p, rng))
      for p in problems
    ]
