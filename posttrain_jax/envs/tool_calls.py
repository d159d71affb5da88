"""The tool-call text format: ``<tool>name(args)</tool>`` calls, ``<obs>...</obs>`` observations.

A model's turn calls a tool by writing ``<tool>calculator(48213*9071)</tool>``; the env answers
with ``<obs>437340123</obs>``, appended after the call. :func:`parse` reads the last call of a
turn (``None`` when there is none: the turn is the final answer; a :class:`ParseError` value, not
an exception, when the call is malformed), :func:`render_observation` wraps a tool's text (cut to
a budget, the cut marked) and :func:`split_transcript` tells the model's text from the env's in a
whole transcript (for loss masks: observation tokens are not the model's).
"""

import dataclasses
import re

TOOL_OPEN, TOOL_CLOSE = "<tool>", "</tool>"
OBS_OPEN, OBS_CLOSE = "<obs>", "</obs>"
TRUNCATED = "...(cut)"  # ends an observation cut to its budget
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclasses.dataclass(frozen=True)
class Call:
  """A well-formed tool call: the tool's name and the text between the outer parentheses."""

  name: str
  args: str


@dataclasses.dataclass(frozen=True)
class ParseError:
  """A malformed call; ``reason`` is fed back to the model (it names the problem and the form)."""

  reason: str


def format_call(name: str, args: str) -> str:
  """The text of a call: ``<tool>name(args)</tool>``."""
  return f"{TOOL_OPEN}{name}({args}){TOOL_CLOSE}"


def _closing(text: str) -> int | None:
  """The index of the parenthesis closing ``text[0] == "("``, or None when none does."""
  depth = 0
  for i, c in enumerate(text):
    depth += (c == "(") - (c == ")")
    if depth == 0:
      return i
  return None


def _parse_body(body: str, tools) -> Call | ParseError:
  """The call inside one ``<tool>...</tool>`` pair."""
  form = f"write {TOOL_OPEN}name(args){TOOL_CLOSE}"
  match = NAME.match(body)
  if match is None:
    return ParseError(f"no tool name in {body!r}; {form}")
  name, rest = match.group(), body[match.end() :]
  if tools is not None and name not in tools:
    return ParseError(f"unknown tool {name!r}; tools: {', '.join(sorted(tools))}")
  if not rest.startswith("("):
    return ParseError(f"the call to {name} needs its arguments in parentheses; {form}")
  end = _closing(rest)
  if end is None or rest.count("(") != rest.count(")"):
    return ParseError(f"unbalanced parentheses in the call to {name}")
  if end != len(rest) - 1:
    return ParseError(f"text after the closing parenthesis of the call to {name}; {form}")
  return Call(name, rest[1:-1])


def parse(text: str, tools=None) -> Call | ParseError | None:
  """The last complete call in a turn's ``text``, ``None`` when it has no call tag at all, or a
  :class:`ParseError` naming the problem: a ``<tool>`` without its ``</tool>``, a ``</tool>``
  without its ``<tool>``, no name, an unknown tool (when ``tools``, the valid names, is given),
  arguments not in parentheses, unbalanced parentheses, or text after the closing one.
  The arguments are the text between the outer parentheses, which must balance inside."""
  opened = text.rfind(TOOL_OPEN)
  if opened < 0:
    if TOOL_CLOSE in text:
      return ParseError(f"{TOOL_CLOSE} without {TOOL_OPEN} before it")
    return None
  start = opened + len(TOOL_OPEN)
  closed = text.find(TOOL_CLOSE, start)
  if closed < 0:
    return ParseError(f"{TOOL_OPEN} without {TOOL_CLOSE} after it")
  return _parse_body(text[start:closed], tools)


def sanitize(text: str) -> str:
  """``text`` with every observation tag removed, so that tool output cannot end its
  observation early or open another (the segments of :func:`split_transcript` stay exact). Call
  tags may stay: only the model's own turn is ever parsed for calls."""
  while OBS_OPEN in text or OBS_CLOSE in text:
    text = text.replace(OBS_OPEN, "").replace(OBS_CLOSE, "")
  return text


def render_observation(text: str, max_chars: int) -> str:
  """``<obs>text</obs>``, the (sanitized) text cut to ``max_chars`` characters with the cut
  marked by ending in ``TRUNCATED``."""
  if max_chars < len(TRUNCATED):
    raise ValueError(
      f"max_chars={max_chars} leaves no room for the cut mark {TRUNCATED!r}; "
      f"use at least {len(TRUNCATED)}"
    )
  text = sanitize(text)
  if len(text) > max_chars:
    text = text[: max_chars - len(TRUNCATED)] + TRUNCATED
  return f"{OBS_OPEN}{text}{OBS_CLOSE}"


def final_text(transcript: str) -> str:
  """The text after the last observation (the whole text when there is none): the answer."""
  return transcript.rpartition(OBS_CLOSE)[2]


def split_transcript(transcript: str) -> list[tuple[str, bool]]:
  """``(text, is_model)`` segments that concatenate back to ``transcript``: each
  ``<obs>...</obs>`` span (tags included) that starts right after a call's ``</tool>`` is the
  env's (``False``), the text between them the model's (``True``); empty segments are left out.
  An ``<obs>`` anywhere else was written by the model itself (the env answers every call at
  once, and only a call), so it stays in the model's text. An ``<obs>`` without ``</obs>`` runs
  to the end (an observation cut off by a length budget)."""
  out, pos, model_from = [], 0, 0
  while pos < len(transcript):
    start = transcript.find(OBS_OPEN, pos)
    if start < 0:
      break
    if not transcript[:start].endswith(TOOL_CLOSE):
      pos = start + len(OBS_OPEN)  # a forged observation: the model's text
      continue
    if start > model_from:
      out.append((transcript[model_from:start], True))
    end = transcript.find(OBS_CLOSE, start)
    end = len(transcript) if end < 0 else end + len(OBS_CLOSE)
    out.append((transcript[start:end], False))
    pos = model_from = end
  if model_from < len(transcript):
    out.append((transcript[model_from:], True))
  return out
