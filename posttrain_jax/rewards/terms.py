"""A run's reward as a weighted sum of named terms (``config.reward.terms``).

The env's (or dataset's) verifier is the term ``correct`` (weight 1 unless the config gives it
another, 0 drops it); every other term is a function of ``REWARDS`` or a user's own
(``"module:function"``, ``"path/file.py:function"``, see :mod:`~posttrain_jax.rewards.catalogue`)::

    config.reward.terms = {
        "format": {"weight": 0.1},                                  # REWARDS["format"]
        "brevity": {"fn": "my_rewards.py:brevity", "weight": 0.5, "kwargs": {"target": 8}},
    }

The total reward of a completion is ``sum_i weight_i * value_i``; each term's mean value is
logged as ``reward/<name>`` (a term returning a mapping of named floats also logs
``reward/<name>/<key>`` and counts as their sum).

Failures are judged per call (:mod:`~posttrain_jax.rewards.outcomes`): a term call that raises,
hangs past ``config.reward.timeout`` (row terms; each term of a row has its own timeout), or
returns NaN/inf or a non-number scores 0 for that term only, is counted in
``reward/<name>/errors`` and in ``reward/errors/<kind>`` (the row's first failure), and the first
failure of each kind prints one warning line naming the term, its function and the problem.
Row terms run in the reward worker processes (:mod:`~posttrain_jax.rewards.calls`); batched
terms run in the run's process, once per batch, without a timeout.
"""

import dataclasses
import math
import sys
from typing import Mapping

import numpy as np

from posttrain_jax.registry import ConfigError
from posttrain_jax.rewards import calls, catalogue, outcomes

CORRECT = "correct"  # the term that is the env's own verifier
ENV_FN = "env"  # its fn


@dataclasses.dataclass(frozen=True)
class Term:
  """One configured term: ``name`` (metrics), ``fn`` (a spec for :func:`catalogue.resolve`, or
  ``'env'``), ``weight``, ``kwargs`` (sorted items) and whether it is ``batched``."""

  name: str
  fn: str
  weight: float
  kwargs: tuple = ()
  batched: bool = False


def parse(config_terms) -> tuple[Term, ...]:
  """The terms of ``config.reward.terms`` (name -> {fn, weight, kwargs}), ``correct`` first
  (added with weight 1 when absent); a ConfigError names the bad key and the fix."""
  terms = {CORRECT: Term(CORRECT, ENV_FN, 1.0)}
  for name, entry in dict(config_terms or {}).items():
    key = f"config.reward.terms.{name}"
    entry = dict(entry) if entry is not None else {}
    unknown = set(entry) - {"fn", "weight", "kwargs"}
    if unknown:
      raise ConfigError(
        f"{key} has unknown key(s) {sorted(unknown)}; a term takes fn (a reward "
        "name, 'module:function' or 'file.py:function'), weight and kwargs"
      )
    weight = entry.get("weight", 1.0)
    if (
      isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight)
    ):
      raise ConfigError(f"{key}.weight must be a finite number, got {weight!r}")
    kwargs = dict(entry.get("kwargs") or {})
    if name == CORRECT:
      if entry.get("fn", ENV_FN) != ENV_FN or kwargs:
        raise ConfigError(
          f"{key} is the env's own verifier: give it only a weight (name "
          "another term for a different correctness check)"
        )
      terms[CORRECT] = Term(CORRECT, ENV_FN, float(weight))
      continue
    fn = entry.get("fn", name)
    if not isinstance(fn, str) or not fn:
      raise ConfigError(f"{key}.fn must be a reward name or 'module:function', got {fn!r}")
    resolved = catalogue.resolve(fn, key + ".fn")
    terms[name] = Term(
      name, fn, float(weight), tuple(sorted(kwargs.items())), catalogue.is_batched(resolved)
    )
  return tuple(terms.values())


def _value(term: Term, raw) -> tuple[float, int, str, dict]:
  """A term's returned ``raw`` judged: ``(value, code, detail, {sub: value})``; a mapping's
  values are judged one by one and summed."""
  if isinstance(raw, Mapping):
    subs, total = {}, 0.0
    for sub, v in raw.items():
      judged = outcomes.judge(v)
      if judged.code != outcomes.OK:
        return 0.0, judged.code, f"key {sub!r}: {judged.detail}", {}
      subs[str(sub)] = judged.reward
      total += judged.reward
    return total, outcomes.OK, "", subs
  judged = outcomes.judge(raw)
  return judged.reward, judged.code, judged.detail, {}


class RowTerms:
  """The row terms of one verifier, sent to the reward workers (picklable: functions are
  named by spec and resolved where they run). :meth:`score_row` calls each term with its own
  timeout and returns the row's weighted total as an :class:`~outcomes.Outcome` whose
  ``components`` are ``(name, value, code, detail)`` per term (and sub-key)."""

  def __init__(self, verifier, terms: tuple[Term, ...]):
    self.verifier, self.terms = verifier, tuple(t for t in terms if not t.batched)
    self._fns = None

  @property
  def calls_per_row(self) -> int:
    return len(self.terms)

  def __getstate__(self):
    return {"verifier": self.verifier, "terms": self.terms, "_fns": None}

  def _resolve(self):
    if self._fns is None:
      self._fns = [
        calls.verify_of(self.verifier) if t.fn == ENV_FN else catalogue.resolve(t.fn)
        for t in self.terms
      ]
    return self._fns

  def score_row(
    self, problem, completion, timeout: float = 0.0, *, skip=None, progress=None
  ) -> outcomes.Outcome:
    """``skip``: {term index: (code, detail)} for terms already known to fail this row (one
    that killed or hung its worker: the pool scores the row again without it, so the other
    terms keep their values); ``progress(i)`` is called before term ``i`` runs."""
    total, first, detail, components = 0.0, outcomes.OK, "", []
    skip = skip or {}
    for i, (term, fn) in enumerate(zip(self.terms, self._resolve())):
      kwargs = dict(term.kwargs)
      if i in skip:
        res = calls.Raw(None, *skip[i])
      else:
        if progress is not None:
          progress(i)
        res = calls.call_raw(lambda p, c: fn(p, c, **kwargs), problem, completion, timeout)
      if res.code == outcomes.OK:
        value, code, why, subs = _value(term, res.value)
      else:
        value, code, why, subs = 0.0, res.code, res.detail, {}
      components.append((term.name, value, code, why))
      components.extend((f"{term.name}/{k}", v, outcomes.OK, "") for k, v in subs.items())
      if code != outcomes.OK and first == outcomes.OK:
        first, detail = code, f"term {term.name!r} ({term.fn}): {why}"
      total += term.weight * value
    return outcomes.Outcome(total, first, detail, tuple(components))


class RewardSet:
  """The run's terms: :meth:`score` gives ``(rewards [N], codes [N], components)`` for a batch,
  row terms through the run's :class:`~calls.Scorer`, batched terms here."""

  def __init__(self, terms: tuple[Term, ...], run: catalogue.RunInfo, out=None):
    self.terms, self.run, self._out = terms, run, out
    self._rows: dict[int, RowTerms] = {}
    self._warned: set = set()

  @classmethod
  def from_config(cls, config_terms, run: catalogue.RunInfo, out=None) -> "RewardSet":
    return cls(parse(config_terms), run, out)

  @property
  def is_plain(self) -> bool:
    """Only the env's verifier at weight 1 (the run scores exactly as without terms)."""
    return len(self.terms) == 1 and self.terms[0].weight == 1.0

  def _row_terms(self, verifier) -> RowTerms:
    """One RowTerms per verifier object (the worker pool pickles it once)."""
    entry = self._rows.get(id(verifier))
    if entry is None or entry.verifier is not verifier:
      entry = self._rows[id(verifier)] = RowTerms(verifier, self.terms)
    return entry

  def _warn(self, term: Term, problem, completion, code: int, detail: str) -> None:
    if (term.name, code) in self._warned:
      return
    self._warned.add((term.name, code))
    kind = outcomes.KINDS[code - 1]
    print(
      f"warning: reward term {term.name!r} ({term.fn}) failed ({kind}) on problem "
      f"{getattr(problem, 'uid', '?')!r}, completion {outcomes.excerpt(completion)}: "
      f"{detail}; scored 0 for this term and counted in reward/{term.name}/errors and "
      f"{outcomes.METRIC}{kind} (shown once per term and kind)",
      file=self._out or sys.stderr,
      flush=True,
    )

  def score(self, scorer, verifier, problems, completions, *, env: str):
    """``(total rewards [N] float32, codes [N] int32, components {name: [N] float32}, errors
    {name: [N] bool})`` of every term on each (problem, completion)."""
    problems, completions = list(problems), list(completions)
    n = len(problems)
    rows = scorer.score_outcomes(
      self._row_terms(verifier), problems, completions, env=env, quiet=True
    )
    total = np.asarray([r.reward for r in rows], np.float64)
    codes = np.asarray([r.code for r in rows], np.int32)
    comps, errs = {}, {}
    by_name = {t.name: t for t in self.terms}
    for i, r in enumerate(rows):
      if not r.components and r.code != outcomes.OK:  # the whole row timed out or died
        for t in self.terms:
          if not t.batched:
            errs.setdefault(t.name, np.zeros(n, bool))[i] = True
            self._warn(t, problems[i], completions[i], r.code, r.detail)
      for name, value, code, detail in r.components:
        comps.setdefault(name, np.zeros(n, np.float64))[i] = value
        if code != outcomes.OK:
          errs.setdefault(name, np.zeros(n, bool))[i] = True
          self._warn(by_name[name], problems[i], completions[i], code, detail)
    for t in self.terms:
      if t.batched:
        values, bad, code, why = self._batched(t, problems, completions)
        comps[t.name] = values
        if bad.any():
          errs[t.name] = bad
          codes = np.where((codes == outcomes.OK) & bad, code, codes)
          first = int(np.argmax(bad))
          self._warn(t, problems[first], completions[first], code, why)
        total = total + t.weight * values
    for t in self.terms:
      comps.setdefault(t.name, np.zeros(n, np.float64))
    return (
      total.astype(np.float32),
      codes,
      {k: v.astype(np.float32) for k, v in comps.items()},
      {t.name: errs.get(t.name, np.zeros(n, bool)) for t in self.terms},
    )

  def _batched(self, term: Term, problems, completions):
    """``(values [N], failed [N] bool, code, detail)`` of a batched term: an exception fails
    every row (``raised``), a result that is not ``N`` numbers too (``non_numeric``); NaN/inf
    entries fail their rows (``nonfinite``). Failed rows score 0."""
    n = len(problems)
    zeros, every = np.zeros(n), np.ones(n, bool)
    try:
      raw = catalogue.resolve(term.fn)(problems, completions, run=self.run, **dict(term.kwargs))
    except Exception as e:  # pylint: disable=broad-except
      return zeros, every, outcomes.CODES["raised"], outcomes.raised(e).detail
    try:
      arr = np.asarray(raw, np.float64).reshape(-1)
    except (TypeError, ValueError):
      arr = None
    if arr is None or arr.shape != (n,):
      return (
        zeros,
        every,
        outcomes.CODES["non_numeric"],
        f"returned {outcomes.excerpt(raw)}, not {n} numbers",
      )
    bad = ~np.isfinite(arr)
    return (
      np.where(bad, 0.0, arr),
      bad,
      outcomes.CODES["nonfinite"],
      f"returned {int(bad.sum())} non-finite value(s) of {n}",
    )

  def metrics(self, components: dict, errors: dict, mask=None) -> dict[str, float]:
    """``reward/<name>`` (mean over rows where ``mask``) and ``reward/<name>/errors`` (count)."""
    out = {}
    for name, values in components.items():
      v = values if mask is None else values[np.asarray(mask) > 0]
      out[f"reward/{name}"] = float(v.mean()) if v.size else 0.0
    for name, bad in errors.items():
      b = bad if mask is None else bad[np.asarray(mask) > 0]
      out[f"reward/{name}/errors"] = float(b.sum())
    return out
