"""What one reward call returned, judged: a finite number, or one of four kinds of failure.

A reward call is ``verify(problem, completion)``. Its outcome is a reward (a Python float) and a
kind: ``OK`` or a failure that scores 0.0 and is counted:

- ``raised``: the call raised an exception (or its worker process died);
- ``timeout``: no result within ``config.reward.timeout`` seconds;
- ``nonfinite``: it returned NaN, +-inf, or a number beyond float32's range (it would be inf in
  the batch's float32 rewards);
- ``non_numeric``: it returned something that is not one number (a string such as ``"1.0"``,
  None, a complex number, an array whose size is not 1).

Kinds are coded as small integers (``CODES``) so a batch's outcomes travel as a ``[B]`` array
beside its rewards; :func:`counts` turns them into the ``reward/errors/<kind>`` metrics (counts
of calls) and :func:`rate_error` into the message of the stop above ``reward.max_error_rate``.
"""

import math
import numbers
from typing import NamedTuple

import numpy as np

OK = 0
KINDS = ("raised", "timeout", "nonfinite", "non_numeric")
CODES = {kind: i + 1 for i, kind in enumerate(KINDS)}
METRIC = "reward/errors/"  # + kind: how many calls of the step (or evaluation) failed so
EXCERPT = 60  # characters of a prompt, completion or value in a warning
FLOAT32_MAX = float(np.finfo(np.float32).max)  # rewards travel as float32 arrays


class Outcome(NamedTuple):
  """One call's result: ``reward`` (0.0 unless ``code == OK``), the kind's ``code`` and, for a
  failure, ``detail`` (the exception or the returned value, short); a row of several reward
  terms also carries each term's ``components`` (its total may be non-zero with a failure)."""

  reward: float
  code: int = OK
  detail: str = ""
  components: tuple = ()  # (name, value, code, detail) per reward term (rewards/terms.py)


def excerpt(text, limit: int = EXCERPT) -> str:
  """``repr`` of ``text`` cut to about ``limit`` characters."""
  shown = repr(text)
  return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def judge(value) -> Outcome:
  """The outcome of a call that returned ``value``: a real number (bool, int, float, numpy
  scalar, or an array of exactly one real element) that is finite is the reward."""
  number = None
  if isinstance(value, numbers.Real) and not isinstance(value, (str, bytes)):
    number = value
  elif hasattr(value, "shape") and hasattr(value, "dtype"):  # numpy / JAX arrays
    arr = np.asarray(value)
    if arr.size == 1 and arr.dtype.kind in "biuf":
      number = arr.reshape(())
  if number is None:
    return Outcome(
      0.0, CODES["non_numeric"], f"returned {excerpt(value)} ({type(value).__name__}), not a number"
    )
  reward = float(number)
  if not math.isfinite(reward):
    return Outcome(0.0, CODES["nonfinite"], f"returned {reward!r}")
  if abs(reward) > FLOAT32_MAX:
    return Outcome(
      0.0, CODES["nonfinite"], f"returned {reward!r}, beyond float32's range (±{FLOAT32_MAX:.3g})"
    )
  return Outcome(reward)


def raised(exc: BaseException) -> Outcome:
  return Outcome(0.0, CODES["raised"], excerpt(f"{type(exc).__name__}: {exc}", 200)[1:-1])


def timed_out(timeout: float) -> Outcome:
  return Outcome(0.0, CODES["timeout"], f"no result within {timeout:g} s")


def counts(codes, mask=None) -> dict[str, float]:
  """``{"reward/errors/<kind>": number of calls of that kind}`` over the rows where ``mask``
  (default: all rows)."""
  codes = np.asarray(codes).astype(np.int64)
  if mask is not None:
    codes = codes[np.asarray(mask) > 0]
  return {METRIC + kind: float(np.sum(codes == CODES[kind])) for kind in KINDS}


def warning(env: str, problem, completion: str, outcome: Outcome) -> str:
  """The one line printed for the first failure of a kind in a run."""
  kind = KINDS[outcome.code - 1]
  uid = getattr(problem, "uid", "?")
  prompt = getattr(problem, "prompt", "")
  return (
    f"warning: reward of env {env!r} failed ({kind}) on problem {uid!r} (prompt "
    f"{excerpt(prompt)}), completion {excerpt(completion)}: {outcome.detail}; scored 0 "
    f"and counted in {METRIC}{kind} (shown once per kind)"
  )


def rate_error(codes, mask, *, where: str, env: str, max_rate: float) -> str | None:
  """The message of the stop when more than ``max_rate`` of the calls (rows where ``mask``)
  failed, else None."""
  failed = {k[len(METRIC) :]: int(v) for k, v in counts(codes, mask).items() if v}
  total = int(np.sum(np.asarray(mask) > 0)) if mask is not None else len(codes)
  if not total or sum(failed.values()) <= max_rate * total:
    return None
  kinds = ", ".join(f"{k} {n}" for k, n in failed.items())
  advice = "raise config.reward.timeout, " if "timeout" in failed else ""
  return (
    f"{where}: {sum(failed.values())} of {total} reward calls of env {env!r} failed "
    f"({kinds}), above config.reward.max_error_rate={max_rate:g}; fix the env's reward "
    f"(the first failure of each kind was printed above), {advice}or raise "
    "config.reward.max_error_rate (1.0 never stops)"
  )
