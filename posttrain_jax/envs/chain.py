"""Multi-step arithmetic chains with their steps written out: DenoiseRL's toy (methods_B.md
section 15, issue 24).

Prompt ``"7+5*3-9="``: start from the first digit and apply each operation left to right,
modulo 10 (no precedence). The reference writes one step per operation, then the answer after
``#``::

    7+5=2;2*3=6;6-9=7;#7

Level ``L`` (2 to 8) is the number of operations. ``verify`` reads only the text after the last
``#`` (a bare answer is the whole text), so a transcript with a wrong step and a corrected restart scores by its final answer.
The corpus's noise makes a fraction of the transcripts carry one wrong step (a wrong digit,
propagated to the end): what an early checkpoint of a model trained on it also writes, the wrong
partial reasoning DenoiseRL starts rollouts from. A fraction ``correction`` of the clean
transcripts show a slip caught at once: a wrong step, ``!``, the step again, right, then the
rest (``7+5=3;!7+5=2;2*3=6;6-9=7;#7``), so a model trained on them can recover from a wrong step
it reads, at a low rate that RL can raise.

Trace styles (``Chain(trace=...)``; the reasoning-data primer's "trace length at fixed
correctness", experiments/primer_trace.py): ``steps`` (the above), ``answer`` (the answer
alone: ``#7``) and ``checked`` (the steps, the same steps again as a check, then the answer:
``7+5=2;2*3=6;7+5=2;2*3=6;#6``, twice as long). Every style of a problem has the same answer,
and ``verify`` reads only that, so a model trained on one style is scored like any other. The
registered envs ``chain_answer`` and ``chain_checked`` serve the two other styles' corpora.
"""

import jax
import numpy as np

from posttrain_jax.envs import base

NAME = "chain"
OPS = "+-*"
STEP, ANSWER, REDO = ";", "#", "!"
CHARS = "0123456789+-*=;#!"
LEVELS = tuple(range(2, 9))
TRACES = ("steps", "answer", "checked")


def apply(a: int, op: str, b: int) -> int:
  """One step: ``a op b`` modulo 10."""
  if op == "+":
    return (a + b) % 10
  if op == "-":
    return (a - b) % 10
  if op == "*":
    return (a * b) % 10
  raise ValueError(f"unknown operation {op!r}; operations: {OPS}")


def parse_prompt(prompt: str) -> tuple[int, tuple[tuple[str, int], ...]]:
  """``"7+5*3="`` -> ``(7, (("+", 5), ("*", 3)))``."""
  body = prompt.removesuffix("=")
  if len(body) < 3 or len(body) % 2 == 0 or not body[::2].isdigit():
    raise ValueError(f"not a chain prompt: {prompt!r}")
  if any(op not in OPS for op in body[1::2]):
    raise ValueError(f"not a chain prompt: {prompt!r}")
  return int(body[0]), tuple((body[i], int(body[i + 1])) for i in range(1, len(body), 2))


def final_answer(text: str) -> str:
  """The text after the last ``#`` (the whole text without one), stripped."""
  return text.rpartition(ANSWER)[2].strip()


class Chain(base.GeneratedEnv):
  """Apply ``L`` one-digit operations left to right, modulo 10, writing each step."""

  name = NAME
  chars = CHARS
  levels = LEVELS
  numeric_answers = True

  def __init__(
    self,
    eval_percent: int = 10,
    correction: float = 0.1,
    *,
    trace: str = "steps",
    name: str = NAME,
  ):
    if not 0.0 <= correction <= 1.0:
      raise ValueError(f"chain correction must lie in [0, 1], got {correction}")
    if trace not in TRACES:
      raise ValueError(f"chain trace {trace!r} is not one of {TRACES}")
    self.eval_percent, self.correction, self.trace = eval_percent, correction, trace
    self.name = name

  def max_prompt_chars(self, level: int) -> int:
    return 2 * level + 2

  def max_answer_chars(self, level: int) -> int:
    # the clean transcript (a corrected one is 7 characters longer); checked: the steps twice
    if self.trace == "answer":
      return 2
    return (2 if self.trace == "checked" else 1) * 6 * level + 2

  def make(self, start: int, ops, level: int | None = None) -> base.Problem:
    """The problem of ``start`` then ``ops`` ((op, digit) pairs)."""
    ops = tuple((op, int(d)) for op, d in ops)
    level = len(ops) if level is None else level
    if (
      len(ops) != level
      or not 0 <= start <= 9
      or any(not 0 <= d <= 9 or op not in OPS for op, d in ops)
    ):
      raise ValueError(
        f"chain level {level} needs a digit and {level} (op, digit) pairs, got {start} and {ops}"
      )
    prompt = f"{start}" + "".join(f"{op}{d}" for op, d in ops) + "="
    value = start
    for op, d in ops:
      value = apply(value, op, d)
    return base.Problem(
      prompt=prompt, answer=str(value), env=NAME, level=level, uid=prompt, data=(start, ops)
    )

  def _draw(self, rng: np.random.Generator, level: int) -> base.Problem:
    start = int(rng.integers(10))
    ops = tuple((OPS[int(rng.integers(3))], int(rng.integers(10))) for _ in range(level))
    return self.make(start, ops, level)

  def rebuild(self, problem: base.Problem) -> base.Problem:
    self._check_level(problem.level)
    start, ops = problem.data if problem.data else parse_prompt(problem.prompt)
    return self.make(start, ops, problem.level)

  def verify(self, problem: base.Problem, completion: str) -> float:
    """1.0 iff the text after the last ``#`` (the whole text without one) is the chain's
    value."""
    if not isinstance(completion, str):
      return 0.0
    return float(final_answer(completion) == problem.answer)

  def transcript(
    self,
    problem: base.Problem,
    wrong_step: int | None = None,
    wrong_digit: int = 0,
    corrected: bool = False,
  ) -> str:
    """The steps and the answer; with ``wrong_step`` that step's result is replaced by
    ``(true + wrong_digit) % 10`` (``wrong_digit`` in 1..9) and the error carried on, or with
    ``corrected`` caught at once: the wrong step, ``!``, the step again, right."""
    start, ops = problem.data
    value, steps = start, []
    for i, (op, d) in enumerate(ops):
      result = apply(value, op, d)
      if i == wrong_step:
        wrong = (result + wrong_digit) % 10
        if corrected:
          steps.append(f"{value}{op}{d}={wrong}{STEP}{REDO}")
        else:
          result = wrong
      steps.append(f"{value}{op}{d}={result}{STEP}")
      value = result
    body = {"steps": 1, "answer": 0, "checked": 2}[self.trace] * "".join(steps)
    return body + f"{ANSWER}{value}"

  def reference(self, problem: base.Problem) -> str:
    return self.transcript(problem)

  def wrong_transcript(self, problem: base.Problem, rng: np.random.Generator) -> str:
    """A transcript with one wrong step (a uniform step, off by a uniform 1..9) whose answer
    is wrong: draws again while the error is undone later (``*0``, ``*5`` ... can map a wrong
    value back to the right one); an error in the last step is always carried."""
    level = len(problem.data[1])
    while True:
      text = self.transcript(problem, int(rng.integers(level)), int(rng.integers(1, 10)))
      if final_answer(text) != problem.answer:
        return text

  def corpus(self, key, n: int, *, level: int, noise: float = 0.0) -> list[tuple[str, str]]:
    """``n`` (prompt, transcript) pairs; a fraction ``noise`` with one wrong step carried to a
    wrong answer (:meth:`wrong_transcript`), and a fraction ``correction`` of the others with
    a wrong step caught and redone (right answers)."""
    if not 0.0 <= noise <= 1.0:
      raise ValueError(f"corpus noise must lie in [0, 1], got {noise}")
    problems = self.sample(key, n, level=level, split="train")
    rng = base.numpy_rng(jax.random.fold_in(key, 1))
    out = []
    for p in problems:
      if rng.random() < noise:
        out.append((p.prompt, self.wrong_transcript(p, rng)))
      elif rng.random() < self.correction:
        out.append(
          (
            p.prompt,
            self.transcript(p, int(rng.integers(level)), int(rng.integers(1, 10)), corrected=True),
          )
        )
      else:
        out.append((p.prompt, self.transcript(p)))
    return out
