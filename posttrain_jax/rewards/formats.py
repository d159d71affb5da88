"""R1-style format rewards (``<think>...</think><answer>...</answer>``) and the answer blocks.

Row reward terms (``fn(problem, completion, **kwargs) -> float``, registered in ``REWARDS``):

- ``format`` (:func:`format_reward`): 1.0 iff the whole completion is one think block then one
  answer block (whitespace around and between them allowed), each tag present exactly once,
  in that order, and the answer not blank; else 0.0.
- ``tag_count`` (:func:`tag_count_reward`): 0.25 for each of the four tags present exactly
  once (open-r1's ``tag_count_reward``, its fix for completions with several think blocks),
  a denser signal than ``format`` early in training. It counts; it does not check the order.

Both take ``think_prefilled=True`` for chat templates that end the prompt with ``<think>``
(the completion then starts inside the think block, TRL #6966).

Format-reward hacks they refuse: several think (or answer) blocks, tags out of order, an empty
``<answer></answer>`` (``format`` 0; and :mod:`~posttrain_jax.rewards.math_answers` reads no
answer from it), text after the answer block. What they cannot judge: whether the think block
reasons at all (a one-word think block earns the full format reward).

:func:`answer_blocks` gives the contents of the answer blocks, which ``math`` reads in place of
the free text when a completion has any.
"""

import re

from posttrain_jax.rewards.catalogue import REWARDS

THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = "<think>", "</think>", "<answer>", "</answer>"
TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

_LAYOUT = re.compile(r"\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*", re.S)
_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.S)


def _full(completion: str, think_prefilled: bool) -> str:
  return THINK_OPEN + completion if think_prefilled else completion


def answer_blocks(completion) -> list[str] | None:
  """The stripped contents of every complete ``<answer>...</answer>`` block, in order; None when
  there is none (the completion does not use the tags); ``['']`` for an empty block."""
  if not isinstance(completion, str):
    return None
  blocks = _BLOCK.findall(completion)
  return [b.strip() for b in blocks] if blocks else None


def format_reward(problem, completion, *, think_prefilled: bool = False) -> float:
  """1.0 iff the completion is exactly ``<think>...</think><answer>...</answer>`` (each tag
  once, in order, a non-blank answer; whitespace around the blocks allowed), else 0.0."""
  del problem  # the layout is the same for every problem
  if not isinstance(completion, str):
    return 0.0
  text = _full(completion, think_prefilled)
  if any(text.count(tag) != 1 for tag in TAGS):
    return 0.0
  match = _LAYOUT.fullmatch(text)
  return float(match is not None and bool(match.group(2).strip()))


def tag_count_reward(problem, completion, *, think_prefilled: bool = False) -> float:
  """0.25 for each of ``<think>``, ``</think>``, ``<answer>``, ``</answer>`` that appears
  exactly once (0.0 to 1.0; the order is not checked)."""
  del problem
  if not isinstance(completion, str):
    return 0.0
  text = _full(completion, think_prefilled)
  return 0.25 * sum(text.count(tag) == 1 for tag in TAGS)


REWARDS["format"] = format_reward
REWARDS["tag_count"] = tag_count_reward
