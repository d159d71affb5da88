"""Hidden unit tests for generated code: the ``code_tests`` reward term and the code env's check.

A code problem carries its tests in ``problem.data``: its first three fields are
``(template, entry, cases)`` (:class:`CodeTests`; further fields are the env's own):

- ``template``: Python source with ``{completion}`` where the completion goes (e.g.
  ``"def f(a):\\n  return ({completion})\\n"``, or just ``"{completion}"``);
- ``entry``: the name of the function the source defines;
- ``cases``: ``((args, expected), ...)``, ``args`` a sequence of JSON values passed
  positionally, ``expected`` a JSON value.

:func:`check` runs the completed source and every case in one :mod:`sandbox` process; the
sandbox prints one JSON line per case (the value ``entry(*args)`` returned, or the exception's
name), and the comparison with ``expected`` happens here, in the parent, on plain JSON values:
the candidate never sees the expected outputs and cannot patch the comparison (an object whose
``__eq__`` always says True does not survive JSON). A case passes when the decoded value
``== expected`` (so ``3.0`` passes for ``3``, as in an ``assert f(x) == y`` test; floats within
a relative 1e-9). A case with no line (the program died, timed out or ``os._exit``-ed first)
fails. The source is compiled here first: a syntax error scores 0 without starting a process.

``REWARDS["code_tests"]`` is the pass fraction (partial credit); the code env's verifier is
all-or-nothing (:func:`verify`).
"""

import json
import math
from typing import NamedTuple

from posttrain_jax.rewards import sandbox
from posttrain_jax.rewards.catalogue import REWARDS

MAX_SOURCE_CHARS = 20_000

# Runs inside the sandbox: the payload (source, entry, args, per-case seconds) on stdin, one
# JSON line per case on the real stdout (the candidate's own prints go to stderr).
HARNESS = """import json, signal, sys
_p = json.loads(sys.stdin.read())
_out, sys.stdout = sys.stdout, sys.stderr
def _alarm(signum, frame):
  raise TimeoutError("over the per-case time limit")
_ns = {"__name__": "candidate"}
try:
  exec(compile(_p["source"], "<candidate>", "exec"), _ns)
  _fn = _ns[_p["entry"]]
except BaseException as e:
  _out.write(json.dumps(["load", type(e).__name__ + ": " + str(e)[:200]]) + "\\n")
  _out.flush()
  raise SystemExit(3)
signal.signal(signal.SIGALRM, _alarm)
for _i, _args in enumerate(_p["args"]):
  try:
    signal.setitimer(signal.ITIMER_REAL, _p["case_s"])
    try:
      _v = _fn(*_args)
    finally:
      signal.setitimer(signal.ITIMER_REAL, 0)
    _line = json.dumps([_i, "ok", _v])
  except BaseException as e:
    _line = json.dumps([_i, "error", type(e).__name__ + ": " + str(e)[:100]])
  _out.write(_line + "\\n")
  _out.flush()
"""


class CodeTests(NamedTuple):
  """The tests of one code problem (the first three fields of its ``data``)."""

  template: str
  entry: str
  cases: tuple


class Verdict(NamedTuple):
  """The outcome of running one completion against its tests.

  Attributes:
    score: passed / total.
    passed, total: test counts.
    reason: one line for a human (why it failed, or ``all N tests passed``).
    result: the sandbox run (None when the source did not compile or was too long).
  """

  score: float
  passed: int
  total: int
  reason: str
  result: sandbox.Result | None


def tests_of(problem) -> CodeTests:
  """The :class:`CodeTests` in ``problem.data``'s first three fields; a ValueError that says
  the expected layout otherwise."""
  data = getattr(problem, "data", None)
  try:
    template, entry, cases = tuple(data)[:3]
    cases = tuple((tuple(args), expected) for args, expected in cases)
    ok = isinstance(template, str) and isinstance(entry, str) and entry.isidentifier()
  except (TypeError, ValueError):
    ok = False
  if not ok or "{completion}" not in template or not cases:
    raise ValueError(
      f"problem {getattr(problem, 'uid', '?')!r} carries no code tests: "
      "problem.data must start with (template with '{completion}', entry "
      "function name, ((args, expected), ...)); got "
      f"{str(data)[:120]}"
    )
  return CodeTests(template, entry, cases)


def _plain(value):
  return json.loads(json.dumps(value))


def _equal(got, expected) -> bool:
  """``got == expected`` on plain JSON values, floats within a relative 1e-9."""
  if isinstance(got, list) and isinstance(expected, list):
    return len(got) == len(expected) and all(_equal(g, e) for g, e in zip(got, expected))
  if isinstance(got, dict) and isinstance(expected, dict):
    return got.keys() == expected.keys() and all(_equal(got[k], expected[k]) for k in got)
  if (
    isinstance(got, float)
    and isinstance(expected, (int, float))
    and not isinstance(expected, bool)
    and math.isfinite(got)
  ):
    return math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12)
  return got == expected


def _lines(stdout: str, total: int) -> tuple[dict, str]:
  """``({case index: (status, value)}, load error)`` from the harness's lines (the first line
  of a case counts; anything malformed is ignored)."""
  results, load_error = {}, ""
  for line in stdout.splitlines():
    try:
      item = json.loads(line)
    except ValueError:
      continue
    if isinstance(item, list) and len(item) == 2 and item[0] == "load":
      load_error = load_error or str(item[1])
    elif (
      isinstance(item, list)
      and len(item) == 3
      and type(item[0]) is int
      and 0 <= item[0] < total
      and item[1] in ("ok", "error")
    ):
      results.setdefault(item[0], (item[1], item[2]))
  return results, load_error


def check(
  tests: CodeTests,
  completion,
  limits: sandbox.Limits | None = None,
  *,
  case_s: float = 1.0,
  mode: str | None = None,
) -> Verdict:
  """Runs ``completion`` (put into ``tests.template``) against every case in one sandbox
  process; see the module docstring for the protocol.

  Args:
    tests: the problem's :class:`CodeTests`.
    completion: the generated text (a non-string scores 0).
    limits: the sandbox limits for the whole run (default ``sandbox.Limits()``).
    case_s: wall seconds per case (an alarm inside the sandbox; a case over it fails).
    mode: the sandbox isolation (default: the strongest available).
  """
  total = len(tests.cases)
  if not isinstance(completion, str):
    return Verdict(
      0.0, 0, total, f"the completion is a {type(completion).__name__}, not text", None
    )
  source = tests.template.replace("{completion}", completion)
  if len(source) > MAX_SOURCE_CHARS:
    return Verdict(
      0.0, 0, total, f"the source is {len(source)} characters, over {MAX_SOURCE_CHARS}", None
    )
  try:
    compile(source, "<candidate>", "exec")
  except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as e:
    where = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
    return Verdict(
      0.0, 0, total, f"does not compile: {type(e).__name__}: {getattr(e, 'msg', e)}{where}", None
    )
  payload = json.dumps(
    {
      "source": source,
      "entry": tests.entry,
      "case_s": case_s,
      "args": [list(args) for args, _ in tests.cases],
    }
  )
  result = sandbox.run(HARNESS, payload, limits, mode=mode)
  results, load_error = _lines(result.stdout, total)
  passed, first_failure = 0, ""
  for i, (args, expected) in enumerate(tests.cases):
    got = results.get(i)
    if got is not None and got[0] == "ok" and _equal(got[1], _plain(expected)):
      passed += 1
    elif not first_failure:
      shown = ", ".join(json.dumps(a) for a in args)
      if got is None:
        first_failure = f"{tests.entry}({shown}) gave no result"
      elif got[0] == "error":
        first_failure = f"{tests.entry}({shown}) raised {str(got[1])[:80]}"
      else:
        first_failure = (
          f"{tests.entry}({shown}) returned {json.dumps(got[1])[:40]}, expected "
          f"{json.dumps(expected)[:40]}"
        )
  if passed == total:
    reason = f"all {total} tests passed"
  elif load_error:
    reason = f"the code failed to load: {load_error}"
  else:
    reason = f"{passed} of {total} tests passed; first failure: {first_failure}"
    if not results:
      reason = f"no test results: the sandbox run {result.status}: {result.reason}"
    elif not result.ok and len(results) < total:
      reason += f" (the run ended: {result.status}: {result.reason})"
  return Verdict(passed / total, passed, total, reason, result)


def code_tests(
  problem,
  completion,
  *,
  case_s: float = 1.0,
  cpu_s: float = 2.0,
  wall_s: float = 5.0,
  memory_mb: int = 256,
  processes: int = 16,
  output_bytes: int = sandbox.MIB,
  file_mb: int = 16,
  disk_mb: int = 32,
  open_files: int = 64,
) -> float:
  """Reward term ``code_tests``: the fraction of ``problem``'s hidden tests (``problem.data``,
  see :func:`tests_of`) the completion passes, run in the sandbox. ``case_s``: wall seconds per
  test; the rest are the :class:`sandbox.Limits` of the run. Keep ``config.reward.timeout``
  above ``wall_s``."""
  limits = sandbox.Limits(
    cpu_s=cpu_s,
    wall_s=wall_s,
    memory_mb=memory_mb,
    processes=processes,
    output_bytes=output_bytes,
    file_mb=file_mb,
    disk_mb=disk_mb,
    open_files=open_files,
  )
  return check(tests_of(problem), completion, limits, case_s=case_s).score


def verify(problem, completion, limits: sandbox.Limits | None = None) -> float:
  """1.0 iff the completion passes every hidden test of ``problem``, else 0.0."""
  verdict = check(tests_of(problem), completion, limits)
  return float(verdict.passed == verdict.total)


REWARDS["code_tests"] = code_tests
