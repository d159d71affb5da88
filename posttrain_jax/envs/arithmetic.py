"""Multi-digit addition: ``abc+def=`` with zero-padded operands, answered by the natural sum.

Level ``d`` is the number of digits per operand (1 to 9). The pretraining corpus can hold a
fraction ``noise`` of worked answers that forget every carry (each digit summed mod 10), a
systematic error of the kind a mixed-quality corpus contains; RL on the exact verifier can then
select the correct behaviour that the corpus also teaches.

``feedback`` says where an attempt first goes wrong (``"56!57"``: the attempt 569 of 123+456
is right up to 5, then should read 7), ``corrupt`` makes a plausible wrong attempt: the error
feedback and the wrong attempts of the OPSD predictive law's toy (methods_B.md section 10).
"""

import jax
import numpy as np

from posttrain_jax.envs import base

NAME = "arithmetic"
CHARS = "0123456789+="
LEVELS = tuple(range(1, 10))
DIGITS = "0123456789"
OK = "OK"  # the feedback on a correct attempt
UNKNOWN = "-"  # stands for a character of an attempt that is no digit


class Arithmetic:
  """Addition of two ``level``-digit numbers."""

  name = NAME
  chars = CHARS
  levels = LEVELS
  numeric_answers = True  # zero-padding an answer leaves the same number (contexts.hint_target)

  def __init__(self, eval_percent: int = 10):
    self.eval_percent = eval_percent

  def _check_level(self, level: int) -> None:
    if level not in LEVELS:
      raise ValueError(f"arithmetic level must be in {LEVELS[0]}..{LEVELS[-1]}, got {level}")

  def max_prompt_chars(self, level: int) -> int:
    return 2 * level + 2

  def max_answer_chars(self, level: int) -> int:
    return level + 1

  def max_feedback_chars(self, level: int) -> int:
    return 2 * self.max_answer_chars(level) + 2

  def make(self, a: int, b: int, level: int) -> base.Problem:
    prompt = f"{a:0{level}d}+{b:0{level}d}="
    return base.Problem(
      prompt=prompt, answer=str(a + b), env=NAME, level=level, uid=prompt, data=(a, b)
    )

  def sample(self, key, n: int, *, level: int, split: str = "train") -> list[base.Problem]:
    """``n`` problems of ``level`` from ``split``, drawn from ``key``."""
    self._check_level(level)
    rng = base.numpy_rng(key)
    hi = 10**level
    draw = lambda r: self.make(int(r.integers(hi)), int(r.integers(hi)), level)
    return base.sample_until(rng, n, draw, split, self.eval_percent)

  def variants(self, problem: base.Problem) -> tuple[str, list[str]]:
    """LaRA's perturbations of a prompt (methods_B.md section 11): the prompt with its second
    operand removed (``123+=``: information removed) and its paraphrase with the operands
    swapped (``456+123=``: the same sum)."""
    a, b = problem.prompt.removesuffix("=").split("+")
    return f"{a}+=", [f"{b}+{a}="]

  def verify(self, problem: base.Problem, completion: str) -> float:
    """1.0 iff the completion (whitespace-stripped) is exactly the natural sum."""
    if not isinstance(completion, str):
      return 0.0
    return float(completion.strip() == problem.answer)

  def rebuild(self, problem: base.Problem) -> base.Problem:
    """The problem regenerated from its operands (``data``, else the prompt ``a+b=``): a
    stored problem must equal it, so a wrong stored answer is caught (static datasets)."""
    self._check_level(problem.level)
    if problem.data:
      a, b = problem.data
    else:
      a, _, b = problem.prompt.removesuffix("=").partition("+")
    a, b = int(a), int(b)
    if not 0 <= a < 10**problem.level or not 0 <= b < 10**problem.level:
      raise ValueError(f"operands {a}, {b} do not have at most {problem.level} digits")
    return self.make(a, b, problem.level)

  @staticmethod
  def no_carry_sum(a: int, b: int) -> str:
    """The sum computed digit by digit with every carry forgotten."""
    out, place = 0, 1
    while a or b:
      out += ((a % 10 + b % 10) % 10) * place
      a, b, place = a // 10, b // 10, place * 10
    return str(out)

  def corpus(self, key, n: int, *, level: int, noise: float = 0.0) -> list[tuple[str, str]]:
    """``n`` (prompt, completion) pretraining pairs from the train split.

    A fraction ``noise`` of completions is the no-carry sum instead of the true sum.
    """
    if not 0.0 <= noise <= 1.0:
      raise ValueError(f"corpus noise must lie in [0, 1], got {noise}")
    problems = self.sample(key, n, level=level, split="train")
    rng = base.numpy_rng(jax.random.fold_in(key, 1))
    wrong = rng.random(n) < noise
    return [
      (p.prompt, self.no_carry_sum(*p.data) if w else p.answer) for p, w in zip(problems, wrong)
    ]

  def feedback(self, problem: base.Problem, completion: str) -> str:
    """``"OK"`` for a correct attempt, else ``"<bad>!<fix>"``: the attempt up to and including
    its first wrong character (from the left), then the true sum up to the same place. For
    123+456 (579): ``"569"`` gives ``"56!57"``, ``"57"`` gives ``"57!579"`` (a digit is
    missing), ``"5790"`` gives ``"5790!579"`` (one too many). A character that is no digit is
    written ``-``."""
    if self.verify(problem, completion):
      return OK
    attempt = "".join(c if c in DIGITS else UNKNOWN for c in str(completion).strip())
    answer = problem.answer
    i = next(
      (i for i, (a, b) in enumerate(zip(attempt, answer)) if a != b), min(len(attempt), len(answer))
    )
    return f"{attempt[: i + 1]}!{answer[: i + 1]}"

  def corrupt(self, problem: base.Problem, rng: np.random.Generator) -> str:
    """A plausible wrong attempt: the no-carry sum when it is wrong, else the true sum with one
    digit changed."""
    a, b = self.rebuild(problem).data
    attempt = self.no_carry_sum(a, b)
    if attempt != problem.answer:
      return attempt
    i = int(rng.integers(len(attempt)))
    digit = DIGITS[(int(attempt[i]) + int(rng.integers(1, 10))) % 10]
    return attempt[:i] + digit + attempt[i + 1 :]
