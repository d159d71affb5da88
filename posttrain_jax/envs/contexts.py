"""Privileged contexts: text a teacher reads before the prompt and the student never sees.

A self-distillation teacher (OPSD, Feedback Distillation; methods_B.md sections 7 and 10) is the
policy, or a copy of it, prompted with ``teacher_prompt = context + "|" + prompt``, where the
context is built from the problem and, for feedback, from the student's own completion; the
student's completion tokens are then scored after that longer prompt. ``CONTEXTS`` maps a name
to a builder ``fn(env, problem, completion, rng, **kwargs) -> str`` (DESIGN.md section 4):

- ``none``: ``''`` (the teacher prompt is the student's);
- ``answer``: the reference answer, ``"579"`` for ``123+456=``;
- ``hint_digits(k, noise=0)``: ``k`` of the answer's digits at random places, the others
  ``-`` (``"-7-"``); each revealed digit is a random wrong one with probability ``noise``. An
  env with ``numeric_answers`` (arithmetic) pads the answer with zeros to its longest length,
  so the hint's length says nothing either: ``k = 0`` reveals nothing, ``k = n`` everything;
- ``feedback``: the env's ``feedback(problem, completion)`` about the student's attempt
  (``"56!57"``: arithmetic's first wrong digit, ``"ac!ab"``: graph_path's first invalid step
  and a valid alternative; ``"OK"`` when it is correct).

The tiny models learn from scratch, so a model can read a context only if pretraining showed
it: ``context_corpus`` is the env's corpus with a fraction of the prompts carrying one (and the
correct answer), while the student's prompts never do. A context writes the characters of
``CHARS`` besides those of ``env.chars``: a run with a context builds its tokenizer with them.
"""

from collections.abc import Callable

import jax
import numpy as np

from posttrain_jax.envs import base, catalogue
from posttrain_jax.registry import ConfigError, lookup

DELIMITER = "|"  # between the context and the prompt; no env that takes a context uses it
HIDDEN = "-"  # a digit a hint does not reveal (also arithmetic's and graph_path's feedback
# for a character of the attempt it cannot name)
DIGITS = "0123456789"
# Every character a context writes besides the env's own: the delimiter, the hidden digit and
# the feedback's "!" and "OK".
CHARS = "".join(sorted(DELIMITER + HIDDEN + "!OK"))


def _max_chars(fn: Callable) -> Callable:
  """Decorator: ``builder.max_chars = fn(env, level, **kwargs)``, its longest context."""

  def tag(builder):
    builder.max_chars = fn
    return builder

  return tag


def _feedback_envs() -> str:
  return ", ".join(sorted(n for n, e in catalogue.ENVS.items() if hasattr(e, "feedback")))


def _check_feedback(env) -> None:
  if not hasattr(env, "feedback"):
    raise ConfigError(
      f"env {env.name!r} gives no feedback on an attempt, so the 'feedback' "
      f"context cannot be built for it; envs with feedback: {_feedback_envs()}"
    )


@_max_chars(lambda env, level, **kwargs: 0)
def none(env, problem: base.Problem, completion: str | None, rng: np.random.Generator) -> str:
  """No context: the teacher reads the student's prompt."""
  return ""


@_max_chars(lambda env, level, **kwargs: env.max_answer_chars(level))
def answer(env, problem: base.Problem, completion: str | None, rng: np.random.Generator) -> str:
  """The reference answer (a solution, for tasks with several)."""
  return problem.answer


def hint_target(env, problem: base.Problem) -> str:
  """The digits a hint reveals from: the answer, zero-padded to the env's longest answer when
  the env's answers are numbers (``env.numeric_answers``); ConfigError if not digits."""
  target = problem.answer
  if getattr(env, "numeric_answers", False):
    target = target.zfill(env.max_answer_chars(problem.level))
  if not (target.isascii() and target.isdigit()):
    raise ConfigError(
      f"the 'hint_digits' context reveals digits of the answer, but env "
      f"{env.name!r} answers {problem.answer!r}; use it with an env whose "
      "answers are digits (arithmetic, digit_sum) or choose the 'answer' context"
    )
  return target


@_max_chars(lambda env, level, **kwargs: env.max_answer_chars(level))
def hint_digits(
  env,
  problem: base.Problem,
  completion: str | None,
  rng: np.random.Generator,
  *,
  k: int,
  noise: float = 0.0,
) -> str:
  """``k`` digits of :func:`hint_target` at places drawn without replacement (all of them when
  ``k`` exceeds its length; ``k = -1``: a number drawn uniformly from 0 to the length for each
  hint, pretraining on hints of every informativeness), the others written ``-``; each
  revealed digit is replaced by a uniformly drawn wrong digit with probability ``noise``."""
  if not isinstance(k, (int, np.integer)) or k < -1:
    raise ConfigError(
      f"hint_digits needs a whole number k >= 0 of revealed digits (or -1 for a "
      f"random number per hint), got {k!r}"
    )
  if not 0.0 <= noise <= 1.0:
    raise ConfigError(f"hint_digits noise is a probability in [0, 1], got {noise}")
  target = hint_target(env, problem)
  if k == -1:
    k = int(rng.integers(len(target) + 1))
  shown = set(rng.choice(len(target), min(k, len(target)), replace=False).tolist())
  out = []
  for i, digit in enumerate(target):
    if i not in shown:
      out.append(HIDDEN)
    elif rng.random() < noise:
      out.append(str((int(digit) + int(rng.integers(1, 10))) % 10))
    else:
      out.append(digit)
  return "".join(out)


def _feedback_chars(env, level: int, **kwargs) -> int:
  _check_feedback(env)
  return env.max_feedback_chars(level)


@_max_chars(_feedback_chars)
def feedback(env, problem: base.Problem, completion: str | None, rng: np.random.Generator) -> str:
  """The env's feedback on the student's ``completion`` (``env.feedback``)."""
  _check_feedback(env)
  if completion is None:
    raise ValueError("the 'feedback' context is about the student's completion; pass it")
  return env.feedback(problem, completion)


feedback.needs_completion = True

CONTEXTS: dict[str, Callable] = {
  "none": none,
  "answer": answer,
  "hint_digits": hint_digits,
  "feedback": feedback,
}


def get_context(name: str) -> Callable:
  """``CONTEXTS[name]``, or a ConfigError listing the valid names."""
  return lookup(CONTEXTS, name, "context")


def _check_env(env) -> None:
  if DELIMITER in env.chars:
    raise ConfigError(
      f"env {env.name!r} writes {DELIMITER!r}, the character that ends a "
      "privileged context, so a teacher could not tell context from prompt; "
      "use a context with another env"
    )


def teacher_prompt(
  env, problem: base.Problem, completion: str | None, rng: np.random.Generator, name: str, **kwargs
) -> str:
  """The teacher's prompt: context ``name`` + ``"|"`` + ``problem.prompt``, or the prompt alone
  when the context is empty. ``problem`` is not changed (it is frozen): the student's prompt
  stays ``problem.prompt``."""
  _check_env(env)
  text = get_context(name)(env, problem, completion, rng, **kwargs)
  return f"{text}{DELIMITER}{problem.prompt}" if text else problem.prompt


def check_context(env, level: int, name: str, **kwargs) -> None:
  """Raises a ConfigError, before any run, when context ``name`` with ``kwargs`` cannot be built
  for the problems of ``env`` at ``level`` (it builds one)."""
  _check_env(env)
  builder = get_context(name)
  problem = env.sample(jax.random.key(0), 1, level=level)[0]
  try:
    builder(env, problem, problem.answer, np.random.default_rng(0), **kwargs)
  except TypeError as e:
    raise ConfigError(
      f"context {name!r} does not take the keyword arguments {kwargs}: {e}; "
      "see envs/contexts.py for each context's arguments"
    ) from e


def max_context_chars(env, level: int, name: str, **kwargs) -> int:
  """How many characters context ``name`` adds to a prompt of ``level`` at most (delimiter
  included): the teacher's prompt is at most ``env.max_prompt_chars(level)`` plus this.
  Checks the context first (:func:`check_context`)."""
  check_context(env, level, name, **kwargs)
  longest = get_context(name).max_chars(env, level, **kwargs)
  return longest + 1 if longest else 0


def context_corpus(
  env,
  key: jax.Array,
  n: int,
  *,
  level: int,
  noise: float,
  name: str,
  fraction: float,
  ok_fraction: float = 0.25,
  **kwargs,
) -> list[tuple[str, str]]:
  """``env.corpus(key, n, level, noise)`` with ``round(fraction * n)`` rows, drawn from ``key``,
  prompted by :func:`teacher_prompt` and answered correctly (``problem.answer``): pretraining
  that teaches the model to read context ``name``. For ``feedback`` the attempt commented on
  is the correct answer with probability ``ok_fraction`` (so ``"OK"`` is seen too), else
  ``env.corrupt(problem, rng)``. Deterministic in ``key``."""
  if not 0.0 <= fraction <= 1.0:
    raise ConfigError(f"the context fraction of the corpus lies in [0, 1], got {fraction}")
  builder = get_context(name)
  needs_completion = getattr(builder, "needs_completion", False)
  if needs_completion and not hasattr(env, "corrupt"):
    raise ConfigError(
      f"env {env.name!r} makes no wrong attempts (corrupt), so a feedback "
      f"corpus cannot be built for it; envs with feedback: {_feedback_envs()}"
    )
  _check_env(env)
  pairs = env.corpus(key, n, level=level, noise=noise)
  problems = env.sample(key, n, level=level, split="train")
  if [p.prompt for p in problems] != [prompt for prompt, _ in pairs]:
    raise ValueError(
      f"env {env.name!r}: corpus(key, n) must draw its problems with "
      "sample(key, n, split='train') so contexts can be built for its prompts"
    )
  rng = base.numpy_rng(jax.random.fold_in(key, 2))
  chosen = set(rng.permutation(n)[: round(fraction * n)].tolist())
  out = []
  for i, (p, pair) in enumerate(zip(problems, pairs)):
    attempt = None
    if i in chosen and needs_completion:
      attempt = p.answer if rng.random() < ok_fraction else env.corrupt(p, rng)
    prompt = teacher_prompt(env, p, attempt, rng, name, **kwargs) if i in chosen else p.prompt
    out.append(pair if prompt == p.prompt else (prompt, p.answer))
  return out
