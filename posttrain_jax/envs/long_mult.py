"""Long multiplication with a calculator tool: the first tool-use task (docs/agents.md).

Prompt ``"48213*9071="``: the product of two numbers too long for a tiny model to multiply in
its head. The reference transcript calls the calculator, the env inserts the observation and the
model copies the answer (then EOS)::

    <tool>calculator(48213*9071)</tool><obs>437340123</obs>437340123

Level ``L`` (2 to 6): the first operand has ``L`` digits, the second ``L - 1`` or ``L``. The
verifier reads the text after the last observation, so it scores a single-turn answer
(``"437340123"``) and a whole transcript alike. ``corpus`` gives pretraining transcripts (a
fraction ``noise`` of them answer without the tool, with a wrong-ish guess), and
``transcript_segments`` tells the model's text from the env's observations (for loss masks).
"""

import string

import jax
import numpy as np

from posttrain_jax.envs import base, tool_calls

NAME = "long_mult"
LEVELS = tuple(range(2, 7))
TOOL = "calculator"
# Digits and '*=' of the task, the tags, and what the calculator's and the parser's error
# observations are written in (envs/tools.py, envs/tool_calls.py): its tokenizer encodes them.
CHARS = "".join(sorted(set(string.digits + string.ascii_letters + "*=<>/()_:;.,'-+!? ")))


class LongMult(base.GeneratedEnv):
  """Multiply an ``L``-digit number by an ``L - 1``- or ``L``-digit one, with a calculator."""

  name = NAME
  chars = CHARS
  levels = LEVELS
  numeric_answers = True
  tools = (TOOL,)  # the tools a ToolEnv on this task offers (envs/tools.py names)

  def __init__(self, eval_percent: int = 10):
    self.eval_percent = eval_percent

  def max_prompt_chars(self, level: int) -> int:
    return 2 * level + 2

  def max_answer_chars(self, level: int) -> int:
    return 2 * level

  def make(self, a: int, b: int, level: int) -> base.Problem:
    """The problem ``a*b=`` of ``level``; ValueError when the operands do not fit it."""
    if not (10 ** (level - 1) <= a < 10**level and 10 ** (level - 2) <= b < 10**level):
      raise ValueError(
        f"long_mult level {level} needs a {level}-digit first operand and a "
        f"{level - 1}- or {level}-digit second one, got {a} and {b}"
      )
    prompt = f"{a}*{b}="
    return base.Problem(
      prompt=prompt, answer=str(a * b), env=NAME, level=level, uid=prompt, data=(a, b)
    )

  def _draw(self, rng: np.random.Generator, level: int) -> base.Problem:
    digits_b = level - int(rng.integers(2))
    a = int(rng.integers(10 ** (level - 1), 10**level))
    b = int(rng.integers(10 ** (digits_b - 1), 10**digits_b))
    return self.make(a, b, level)

  def rebuild(self, problem: base.Problem) -> base.Problem:
    """The problem regenerated from its operands (``data``, else the prompt ``a*b=``)."""
    self._check_level(problem.level)
    if problem.data:
      a, b = problem.data
    else:
      a, _, b = problem.prompt.removesuffix("=").partition("*")
    return self.make(int(a), int(b), problem.level)

  def verify(self, problem: base.Problem, completion: str) -> float:
    """1.0 iff the text after the last observation (whitespace-stripped) is the product."""
    if not isinstance(completion, str):
      return 0.0
    return float(tool_calls.final_text(completion).strip() == problem.answer)

  def reference(self, problem: base.Problem) -> str:
    """The transcript that calls the calculator and copies its answer."""
    a, b = problem.data
    answer = str(a * b)
    observation = tool_calls.render_observation(answer, max(len(answer), len(tool_calls.TRUNCATED)))
    return tool_calls.format_call(TOOL, f"{a}*{b}") + observation + answer

  def guess(self, problem: base.Problem, rng: np.random.Generator) -> str:
    """An answer without the tool: the product with its lower half of digits redrawn at random
    (right only by chance)."""
    answer = problem.answer
    keep = len(answer) // 2
    tail = "".join(str(d) for d in rng.integers(10, size=len(answer) - keep))
    return answer[:keep] + tail

  def corpus(self, key, n: int, *, level: int, noise: float = 0.0) -> list[tuple[str, str]]:
    """``n`` (prompt, transcript) pretraining pairs from the train split: the reference
    transcript, or for a fraction ``noise`` of them a :meth:`guess` written without the tool."""
    if not 0.0 <= noise <= 1.0:
      raise ValueError(f"corpus noise must lie in [0, 1], got {noise}")
    problems = self.sample(key, n, level=level, split="train")
    rng = base.numpy_rng(jax.random.fold_in(key, 1))
    noisy = rng.random(n) < noise
    return [
      (p.prompt, self.guess(p, rng) if w else self.reference(p)) for p, w in zip(problems, noisy)
    ]

  def transcript_segments(self, problem: base.Problem, transcript: str) -> list[tuple[str, bool]]:
    """``(text, is_model)`` segments concatenating back to ``transcript`` (the text after
    ``problem``'s prompt): observation spans are the env's, the rest the model's."""
    if not isinstance(problem, base.Problem) or problem.env != NAME:
      raise ValueError(f"transcript_segments needs a {NAME} problem, got {problem!r}")
    return tool_calls.split_transcript(transcript)
