"""Tools an agent calls by name: the ``TOOLS`` registry and the guarded call that runs one.

A tool is a plain function ``fn(args: str, **options) -> str``: ``args`` is the text between the
parentheses of a call (docs/agents.md), ``options`` its configuration (bound once by
:func:`make_tool`). A tool refuses bad input by raising :class:`ToolError` (its message becomes
the observation); any other exception, a hang past the timeout or a non-string result becomes an
error observation too, never an exception out of the caller (:meth:`Tool.__call__`).

Built in: ``calculator`` (exact rational arithmetic over ``+ - * / ( )``, parsed with ``ast``,
never ``eval``), ``python`` (a snippet run in the rewards sandbox) and ``lookup`` (a key -> text
table from a dict or a JSONL file). A config names a user's tool by a registered name or as
``"package.module:function"`` / ``"path/to/file.py:function"``.

A tool runs in a daemon thread joined with a timeout: a hung tool leaves its caller on time, but
its thread runs on until it returns (Python cannot kill a thread), so a tool that may spin
forever belongs in the sandbox (``python``) or must bound itself.
"""

import ast
import dataclasses
import functools
import inspect
import json
import operator
import os
import threading
from fractions import Fraction
from typing import Callable, Mapping

from posttrain_jax.envs import tool_calls
from posttrain_jax.registry import ConfigError
from posttrain_jax.rewards import catalogue as reward_catalogue
from posttrain_jax.rewards import sandbox

DEFAULT_TIMEOUT_S = 10.0
MAX_EXPRESSION_CHARS = 1000  # the calculator refuses longer input (bounds its work and output)
ERROR_PREFIX = "error: "  # every error observation starts with it


class ToolError(ValueError):
  """A tool's refusal of its input; the message is fed back to the model as the observation."""


_BINARY = {
  ast.Add: operator.add,
  ast.Sub: operator.sub,
  ast.Mult: operator.mul,
  ast.Div: operator.truediv,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_SYMBOLS = {
  ast.Pow: "**",
  ast.FloorDiv: "//",
  ast.Mod: "%",
  ast.MatMult: "@",
  ast.LShift: "<<",
  ast.RShift: ">>",
  ast.BitOr: "|",
  ast.BitAnd: "&",
  ast.BitXor: "^",
  ast.Invert: "~",
  ast.Not: "not",
}


def _refusal(node: ast.AST) -> str:
  """Why the calculator refuses ``node``."""
  if isinstance(node, ast.Name):
    return f"names are not allowed: {node.id}"
  if isinstance(node, ast.Attribute):
    return "attribute access is not allowed"
  if isinstance(node, ast.Call):
    return "function calls are not allowed"
  if isinstance(node, ast.Constant):
    return f"only integers are allowed, got {node.value!r}"
  op = getattr(node, "op", None)
  if op is not None:
    return f"operator {_SYMBOLS.get(type(op), type(op).__name__)} is not allowed; use + - * /"
  return f"{type(node).__name__.lower()} is not allowed; use integers and + - * / ( )"


def _evaluate(node: ast.AST) -> Fraction:
  if isinstance(node, ast.Constant) and type(node.value) is int:  # bool is no integer here
    return Fraction(node.value)
  if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
    left, right = _evaluate(node.left), _evaluate(node.right)
    if isinstance(node.op, ast.Div) and right == 0:
      raise ToolError("division by zero")
    return _BINARY[type(node.op)](left, right)
  if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
    return _UNARY[type(node.op)](_evaluate(node.operand))
  raise ToolError(_refusal(node))


def calculator(args: str) -> str:
  """The exact value of an arithmetic expression over integers, ``+ - * /`` and parentheses:
  an integer (``"437340123"``) or a reduced fraction (``"7/2"``). Raises :class:`ToolError` on
  anything else (names, attributes, calls, floats, ``**``, a syntax error, too long input)."""
  text = args.strip()
  if not text:
    raise ToolError("empty expression; write e.g. 12*34")
  if len(text) > MAX_EXPRESSION_CHARS:
    raise ToolError(f"expression too long ({len(text)} chars, at most {MAX_EXPRESSION_CHARS})")
  try:
    tree = ast.parse(text, mode="eval")
  except SyntaxError as e:
    raise ToolError(f"syntax error ({e.msg}); write e.g. (12+3)*4") from None
  except (RecursionError, MemoryError, ValueError):
    raise ToolError("expression too deeply nested") from None
  try:
    value = _evaluate(tree.body)
  except RecursionError:
    raise ToolError("expression too deeply nested") from None
  return str(value.numerator) if value.denominator == 1 else str(value)


def python(args: str, *, cpu_s: float = 2.0, wall_s: float = 5.0, memory_mb: int = 256) -> str:
  """What the Python snippet ``args`` prints, run in the rewards sandbox with these limits
  (docs/sandbox.md); :class:`ToolError` with the sandbox's status and reason when it fails."""
  result = sandbox.run(args, b"", sandbox.Limits(cpu_s=cpu_s, wall_s=wall_s, memory_mb=memory_mb))
  if not result.ok:
    raise ToolError(f"{result.status}: {result.reason}")
  return result.stdout


def _prepare_python(**options) -> dict:
  sandbox.Limits(**options)  # a bad limit fails at config time, with the sandbox's ConfigError
  return options


python.prepare = _prepare_python


def load_corpus(corpus, key: str = "lookup.corpus") -> dict[str, str]:
  """A lookup table from a mapping of str to str, or from a JSONL file of ``{"key": ..., "text":
  ...}`` records; a ConfigError naming the problem (with ``path:line:``) otherwise."""
  if isinstance(corpus, Mapping):
    bad = [k for k, v in corpus.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
      raise ConfigError(f"{key}: keys and texts must be strings; bad entry {bad[0]!r}")
    return dict(corpus)
  if not isinstance(corpus, (str, os.PathLike)):
    raise ConfigError(
      f"{key}: give a dict of key -> text or a JSONL file path, got {type(corpus).__name__}"
    )
  if not os.path.exists(corpus):
    raise ConfigError(f"{key}: corpus file {corpus!r} does not exist")
  table = {}
  with open(corpus, encoding="utf-8") as f:
    for i, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise ConfigError(f"{corpus}:{i}: invalid JSON ({e.msg})") from None
      if (
        not isinstance(record, dict)
        or not isinstance(record.get("key"), str)
        or not isinstance(record.get("text"), str)
      ):
        raise ConfigError(f'{corpus}:{i}: each line must be {{"key": str, "text": str}}')
      table[record["key"]] = record["text"]
  return table


def lookup(args: str, *, corpus: Mapping[str, str]) -> str:
  """The text stored under the key ``args`` (whitespace-stripped); :class:`ToolError` when
  there is none."""
  key = args.strip()
  if key not in corpus:
    raise ToolError(f"no entry for {key!r}")
  return corpus[key]


def _prepare_lookup(corpus=None) -> dict:
  if corpus is None:
    raise ConfigError(
      "tool lookup needs the option corpus: a dict of key -> text or a JSONL "
      'file of {"key": ..., "text": ...} lines'
    )
  return {"corpus": load_corpus(corpus)}


lookup.prepare = _prepare_lookup

TOOLS: dict[str, Callable[..., str]] = {
  "calculator": calculator,
  "python": python,
  "lookup": lookup,
}


@dataclasses.dataclass(frozen=True)
class ToolOutput:
  """What one tool call gave.

  Attributes:
    text: the observation text (the tool's result, or an error starting with ``"error: "``).
    status: ``"ok"``, ``"error"`` (it raised), ``"timeout"`` or ``"bad_output"`` (no string).
  """

  text: str
  status: str

  @property
  def ok(self) -> bool:
    """Whether the tool returned text on its own (status ``ok``)."""
    return self.status == "ok"


def call_with_timeout(fn: Callable, timeout_s: float, *args) -> tuple[str, object]:
  """``fn(*args)`` in a daemon thread: ``("ok", value)``, ``("error", exception)`` or
  ``("timeout", None)`` when it has not returned after ``timeout_s`` seconds."""
  box = {}

  def target():
    try:
      box["value"] = fn(*args)
    except BaseException as e:  # pylint: disable=broad-except
      box["error"] = e

  thread = threading.Thread(target=target, daemon=True, name="posttrain-tool")
  thread.start()
  thread.join(timeout_s)
  if thread.is_alive():
    return "timeout", None
  if "error" in box:
    return "error", box["error"]
  return "ok", box["value"]


@dataclasses.dataclass(frozen=True)
class Tool:
  """A named tool with its options bound and its per-call timeout; calling it never raises."""

  name: str
  fn: Callable[[str], str]
  timeout_s: float = DEFAULT_TIMEOUT_S

  def __call__(self, args: str) -> ToolOutput:
    """Runs the tool on ``args``: its result, or an error observation naming the reason."""
    status, value = call_with_timeout(self.fn, self.timeout_s, args)
    if status == "timeout":
      return ToolOutput(
        f"{ERROR_PREFIX}{self.name}: timed out after {self.timeout_s:g} s", "timeout"
      )
    if status == "error":
      if isinstance(value, ToolError):
        return ToolOutput(f"{ERROR_PREFIX}{self.name}: {value}", "error")
      return ToolOutput(
        f"{ERROR_PREFIX}{self.name} raised {type(value).__name__}: {value}", "error"
      )
    if not isinstance(value, str):
      return ToolOutput(
        f"{ERROR_PREFIX}{self.name} returned {type(value).__name__}, not text", "bad_output"
      )
    return ToolOutput(value, "ok")


def resolve_tool(spec: str, key: str = "tools") -> tuple[str, Callable[..., str]]:
  """``(name, fn)`` for a ``TOOLS`` name or a ``"module:function"`` / ``"file.py:function"``
  spec (the name is then the function's); a ConfigError listing the valid names otherwise."""
  if ":" not in spec:
    if spec not in TOOLS:
      raise ConfigError(
        f"{key}: unknown tool {spec!r}; valid tool names: "
        f"{', '.join(sorted(TOOLS))}, or 'package.module:function', or "
        "'path/to/file.py:function'"
      )
    return spec, TOOLS[spec]
  return spec.rpartition(":")[2], reward_catalogue.import_function(spec, key, kind="tool")


def _signature(fn: Callable) -> inspect.Signature:
  """``fn``'s signature, or one taking any arguments when it has none to read (some builtins)."""
  try:
    return inspect.signature(fn)
  except (TypeError, ValueError):
    return inspect.Signature(
      [
        inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
        inspect.Parameter("options", inspect.Parameter.VAR_KEYWORD),
      ]
    )


def make_tool(spec: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, **options) -> Tool:
  """The tool ``spec`` names (:func:`resolve_tool`) with ``options`` bound (checked against its
  signature, and by its ``prepare(**options) -> options`` hook when it has one)."""
  if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
    raise ConfigError(
      f"tool {spec!r}: timeout_s must be a positive number of seconds, got {timeout_s!r}"
    )
  name, fn = resolve_tool(spec)
  if not tool_calls.NAME.fullmatch(name):
    raise ConfigError(
      f"tool {spec!r}: the name {name!r} cannot be called as name(args); "
      "register it under letters, digits and '_' (not starting with a digit)"
    )
  prepare = getattr(fn, "prepare", None)
  try:
    if prepare is not None:
      options = prepare(**options)
    _signature(fn).bind("", **options)
  except TypeError as e:
    raise ConfigError(f"tool {name!r}: bad options {sorted(options)}: {e}") from None
  return Tool(name, functools.partial(fn, **options) if options else fn, float(timeout_s))


def make_tools(specs) -> dict[str, Tool]:
  """Name -> :class:`Tool` from a list of specs, or a dict spec -> options (``timeout_s`` and
  the tool's own), e.g. ``{"calculator": {}, "lookup": {"corpus": "facts.jsonl"}}``."""
  if isinstance(specs, Mapping):
    items = list(specs.items())
  elif isinstance(specs, (list, tuple)):
    items = [(s, {}) for s in specs]
  else:
    raise ConfigError(
      f"tools: give a list of tool names or a dict name -> options, got {type(specs).__name__}"
    )
  tools = {}
  for spec, options in items:
    if not isinstance(spec, str) or not isinstance(options, Mapping):
      raise ConfigError(f"tools: {spec!r}: expected a tool name and a dict of options")
    tool = make_tool(spec, **options)
    if tool.name in tools:
      raise ConfigError(
        f"tools: two tools are named {tool.name!r}; register one under "
        "another name (TOOLS['other'] = fn)"
      )
    tools[tool.name] = tool
  if not tools:
    raise ConfigError("tools: no tools given; name at least one, e.g. ['calculator']")
  return tools
