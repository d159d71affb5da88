"""Math answer checking: the final answer of a free-text completion against a gold answer.

Two steps, each in its own function:

1. *Extraction* (:func:`extract_answers`, plain regexes and brace matching, no math library):
   the candidate answer strings of a completion. With ``<answer>...</answer>`` blocks
   (:func:`posttrain_jax.rewards.formats.answer_blocks`) only their contents are read; else the
   last ``tail`` characters of the completion. The first rule that finds anything wins:

   - every ``\\boxed{...}`` / ``\\fbox{...}`` (all of them: see "hedging" below);
   - the last "The (final) answer is X";
   - the last "#### X" (GSM8K; X starts like a number, so a markdown heading is no anchor);
   - the last "Answer: X" (also "Final Answer:", "**Answer:**");
   - inside an answer block: the whole block; in free text: the last number (``-3``,
     ``1,234``, ``0.5``, ``7/3``).

   Text anchors keep X up to the end of its line or sentence, drop ``$``/``**`` wrappers and
   trailing punctuation, and drop words after a leading number ("42 apples" -> ``42``).
2. *Equivalence* (:func:`equivalent`) with math-verify (``math_verify.parse`` and
   ``math_verify.verify``, gold first): numbers, fractions (``1/2`` = ``0.5`` =
   ``\\frac{1}{2}``), thousands separators, percentages, LaTeX and simple symbolic expressions
   (``(x+1)^2`` = ``x^2+2x+1``), sets and intervals. Gold and candidate are both parsed as the
   content of a ``\\boxed{}`` (so a bare LaTeX gold such as ``\\dfrac{9}{7}`` parses).

A completion scores 1.0 iff it has at least one candidate and *every* distinct candidate is
equivalent to the gold: two different boxed answers (or answer blocks) are a hedge and score 0,
as in math-verify 0.9 (a self-correction ``\\boxed{41} ... no, \\boxed{42}`` scores 0 too).

Timeouts. math-verify's own timeouts use ``signal.alarm``, which would cancel the per-call
``ITIMER_REAL`` alarm of the reward worker processes (:mod:`posttrain_jax.rewards.calls`). They
are off here (``parsing_timeout=None``, ``timeout_seconds=None``); instead :func:`budget`
bounds one whole check with its own ``ITIMER_REAL`` that composes with an outer one: when the
outer alarm is due first it is left alone (the call then ends as the worker's ``timeout``);
else the check runs under its own, shorter, alarm and the outer one is re-armed with its
remaining time afterwards. A check over its budget (``\\boxed{9^{9^{9^{9}}}}``) scores 0 as a
wrong answer. Off the main thread no alarm can be set, and the check is unbounded there.

:class:`MathAnswer` is the picklable verifier (``verify(problem, completion)``, gold =
``problem.answer``) used by the static datasets' ``math`` rule; ``REWARDS["math"]`` is the same
check as a row reward term.
"""

import contextlib
import functools
import logging
import re
import signal
import threading
import time

from posttrain_jax.rewards import formats
from posttrain_jax.rewards.catalogue import REWARDS

TAIL = 2000  # characters of a completion (without answer blocks) that extraction reads
BUDGET = 5.0  # seconds one check may take before it scores 0 (below reward.timeout's 10 s)

_BOXED = re.compile(r"\\(?:boxed|fbox)\b\s*")
_ANSWER_IS = re.compile(r"\bthe\s+(?:final\s+)?answer\s+is\b[\s:]*", re.I)
_HASHES = re.compile(r"####[ \t]*(?=[-+$\\(\d.])")  # not a markdown heading "#### Step 2"
_ANSWER_COLON = re.compile(r"(?:\*\*)?\b(?:final\s+)?answer\s*(?:\*\*)?\s*:\s*(?:\*\*)?", re.I)
_NUMBER = re.compile(r"(?:(?<![\w)\]}])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")
_LEADING_NUMBER = re.compile(
  r"^(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?)"
  r"(?:[\s,]+[A-Za-z]{2,}.*)?$",
  re.S,
)
_SENTENCE_END = re.compile(r"\.(?:\s|$)|;\s|,\s+(?!(?:and|or)\b)(?=[A-Za-z]{2,})")
_WRAPPERS = ("**", "$$", "$", "\\(", "\\)", "\\[", "\\]")


class OverBudget(BaseException):
  """Raised inside a check when its :func:`budget` runs out (a BaseException, so the
  ``except Exception`` handlers of math-verify and sympy do not swallow it)."""


def _over_budget(signum, frame):
  raise OverBudget()


@contextlib.contextmanager
def budget(seconds: float | None):
  """Raises :class:`OverBudget` inside after ``seconds`` (None or 0: no limit), composing with
  an armed outer ``ITIMER_REAL`` alarm: an outer alarm due first is left to fire; a later one
  is paused and re-armed with its remaining time on exit. No limit off the main thread."""
  if not seconds or threading.current_thread() is not threading.main_thread():
    yield
    return
  outer, interval = signal.getitimer(signal.ITIMER_REAL)
  if outer and outer <= seconds:
    yield
    return
  start = time.monotonic()
  previous = signal.signal(signal.SIGALRM, _over_budget)
  signal.setitimer(signal.ITIMER_REAL, seconds)
  try:
    yield
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)
    if outer:  # due no earlier than now + (outer - seconds) > now: re-armed in the future
      signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 1e-3), interval)


def boxed_contents(text: str) -> list[str]:
  """The contents of every ``\\boxed{...}`` / ``\\fbox{...}`` of ``text`` in order (nested
  braces matched; ``\\boxed 5`` reads the token after the space); an unclosed box is skipped."""
  out = []
  for m in _BOXED.finditer(text):
    i = m.end()
    if i < len(text) and text[i] == "{":
      depth = 0
      for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
          out.append(text[i + 1 : j].strip())
          break
    elif m.group().endswith(" "):
      token = re.match(r"[^\s$]+", text[i:])
      if token:
        out.append(token.group())
  return out


def last_boxed(text: str) -> str | None:
  """The content of the last ``\\boxed{}`` of ``text`` (e.g. a MATH solution's answer)."""
  boxes = boxed_contents(text)
  return boxes[-1] if boxes else None


def clean(answer: str) -> str:
  """A candidate without markdown/LaTeX wrappers, trailing punctuation or the words after a
  leading number."""
  text = answer.strip()
  changed = True
  while changed:
    before = text
    text = text.strip().rstrip(".!;:,").strip()
    for w in _WRAPPERS:
      text = text.removeprefix(w) if text.startswith(w) else text
      text = text.removesuffix(w) if text.endswith(w) else text
    changed = text != before
  number = _LEADING_NUMBER.match(text)
  if number and not re.search(r"\d", text[number.end(1) :]):
    return number.group(1)
  return text


def _after(anchor: re.Pattern, text: str) -> str | None:
  """The cleaned X after the last match of ``anchor``: to the end of its line or sentence."""
  hits = list(anchor.finditer(text))
  if not hits:
    return None
  rest = text[hits[-1].end() :].split("\n", 1)[0]
  end = _SENTENCE_END.search(rest)
  return clean(rest[: end.start()] if end else rest)


def _anchored(text: str) -> list[str] | None:
  """The candidates of the first anchored rule that matches ``text`` (None: none matched)."""
  boxes = boxed_contents(text)
  if boxes:
    return boxes
  for anchor in (_ANSWER_IS, _HASHES, _ANSWER_COLON):
    found = _after(anchor, text)
    if found is not None:
      return [found]
  return None


def extract_answers(completion: str, *, tail: int = TAIL) -> list[str]:
  """The distinct candidate answers of ``completion`` (module docstring: the rules and their
  order); ``[]`` when it states none (no number, an empty answer block)."""
  blocks = formats.answer_blocks(completion)
  if blocks is not None:
    found = []
    for block in blocks:
      inner = _anchored(block)
      found += inner if inner is not None else [clean(block)]
  else:
    text = completion[-tail:] if tail else completion
    found = _anchored(text)
    if found is None:
      numbers = _NUMBER.findall(text)
      found = numbers[-1:]
  return list(dict.fromkeys(a for a in found if a))


@functools.cache
def _math_verify():
  """math_verify, imported on first use with its timeout-disabled warning muted."""
  import math_verify  # pylint: disable=import-outside-toplevel

  for name in ("math_verify", "math_verify.parser", "math_verify.grader"):
    logging.getLogger(name).setLevel(logging.ERROR)
  return math_verify


def parse(answer: str) -> list:
  """math-verify's parse of ``answer`` as a boxed LaTeX answer (then as plain text when that
  gives no SymPy object); a list of SymPy objects and strings, ``[]`` when nothing parses."""
  mv = _math_verify()
  text = answer.strip().strip("$").strip()
  boxed = mv.parse(
    "\\boxed{" + text + "}",
    [mv.LatexExtractionConfig(boxed_match_priority=0)],
    parsing_timeout=None,
  )
  if any(not isinstance(p, str) for p in boxed):
    return boxed
  plain = mv.parse(text, parsing_timeout=None)
  return plain if any(not isinstance(p, str) for p in plain) else boxed or plain


@functools.lru_cache(maxsize=4096)
def _gold(answer: str) -> tuple:
  return tuple(parse(answer))


def equivalent(gold: str, answer: str) -> bool:
  """Whether the candidate ``answer`` equals ``gold`` under math-verify (gold first: its
  comparison is asymmetric); when neither parses, whitespace-free string equality."""
  mv = _math_verify()
  golds, preds = list(_gold(gold)), parse(answer)
  if golds and preds:
    return bool(mv.verify(golds, preds, timeout_seconds=None))
  return "".join(gold.split()) == "".join(answer.split()) != ""


def check(gold: str, completion, *, tail: int = TAIL, time_budget: float | None = BUDGET) -> float:
  """1.0 iff ``completion`` states an answer and every distinct candidate is equivalent to
  ``gold``; 0.0 for a wrong, hedged, missing or over-budget answer (or a non-string)."""
  if not isinstance(completion, str) or not isinstance(gold, str) or not gold.strip():
    return 0.0
  try:
    with budget(time_budget):
      answers = extract_answers(completion, tail=tail)
      return float(bool(answers) and all(equivalent(gold, a) for a in answers))
  except OverBudget:
    return 0.0


class MathAnswer:
  """The ``math`` verifier rule of static datasets: ``verify(problem, completion)`` checks the
  completion's final answer against ``problem.answer`` (:func:`check`). Picklable.

  Attributes:
    tail: characters of the completion read when it has no answer blocks.
    time_budget: seconds one check may take (:func:`budget`).
  """

  eval_percent = 10
  # What a completion needs to state an answer in every extracted form (a StaticDataset adds
  # its prompts' and golds' characters): a character tokenizer built for the dataset has them.
  chars = "".join(
    sorted(
      set(
        "0123456789+-*/^.,:()%$ \\{}_#*<>"
        + "The answer is Answer:"
        + "".join(formats.TAGS)
        + "\\boxed\\frac\\sqrt"
      )
    )
  )
  # The gold is the dataset's; math-verify cannot check it against anything at load time.
  answer_is_reference = True

  def __init__(self, name: str = "math", *, tail: int = TAIL, time_budget: float | None = BUDGET):
    self.name, self.tail, self.time_budget = name, tail, time_budget

  def verify(self, problem, completion) -> float:
    return check(problem.answer, completion, tail=self.tail, time_budget=self.time_budget)

  def __repr__(self) -> str:
    return f"MathAnswer(tail={self.tail}, time_budget={self.time_budget})"


def math_reward(problem, completion, *, tail: int = TAIL, time_budget: float = BUDGET) -> float:
  """The completion's final answer equals ``problem.answer`` under math-verify (1/0): boxed,
  "The answer is", "####", "Answer:" or the last number; inside ``<answer>`` tags if any."""
  return check(problem.answer, completion, tail=tail, time_budget=time_budget)


REWARDS["math"] = math_reward
