"""Static datasets: a fixed set of generated problems on disk, used like an env.

TRON's baseline is a static dataset of N instances instead of the online stream. ``write_dataset``
draws N problems from any registered env with a fixed key and writes them as JSONL, one problem a
line::

  {"prompt": "S25-27=", "answer": "-2", "env": "tron/sub", "level": 2, "uid": "S25-27=",
   "data": [2, 25, 27], "split": "train"}

``StaticDataset(path)`` reads it back with the env protocol (``sample``, ``verify``, ``corpus``,
``levels``, ``chars``, ``max_prompt_chars``, ``max_answer_chars``); ``verify`` and the noisy corpus
delegate to the env named on each line. A malformed line raises ``DatasetError`` naming the file,
the line and what is wrong with it. Readers are pluggable: ``READERS`` maps a file suffix to a
function ``path -> iterable of (line_number, record dict)``; an array_record / TFDS reader only
has to yield the same records.
"""

import json
import os
from collections.abc import Callable, Iterable, Mapping

import jax
import numpy as np

from posttrain_jax.envs import base

FIELDS = ("prompt", "answer", "env", "level", "uid", "data")


class DatasetError(ValueError):
  """A malformed dataset record; the message starts with ``path:line:``."""


def _registry() -> Mapping:
  from posttrain_jax.envs import ENVS  # pylint: disable=import-outside-toplevel
  return ENVS


def _tuples(value):
  """JSON lists back to the tuples ``Problem.data`` holds (recursively)."""
  if isinstance(value, list):
    return tuple(_tuples(v) for v in value)
  return value


def problem_to_record(problem: base.Problem, split: str | None = None) -> dict:
  record = {k: getattr(problem, k) for k in FIELDS}
  record["data"] = json.loads(json.dumps(problem.data))
  if split is not None:
    record["split"] = split
  return record


def record_to_problem(record) -> tuple[base.Problem, str | None]:
  """(Problem, split or None) from a record dict; ValueError saying what is wrong."""
  if not isinstance(record, dict):
    raise ValueError(f"expected a JSON object, got {type(record).__name__}")
  missing = [k for k in ("prompt", "answer", "env", "level") if k not in record]
  if missing:
    raise ValueError(f"missing field(s) {missing}")
  for k in ("prompt", "answer", "env"):
    if not isinstance(record[k], str):
      raise ValueError(f"field {k!r} must be a string, got {record[k]!r}")
  if not isinstance(record["level"], int) or isinstance(record["level"], bool):
    raise ValueError(f"field 'level' must be an integer, got {record['level']!r}")
  uid = record.get("uid", record["prompt"])
  if not isinstance(uid, str):
    raise ValueError(f"field 'uid' must be a string, got {uid!r}")
  split = record.get("split")
  if split is not None and split not in base.SPLITS:
    raise ValueError(f"field 'split' must be one of {base.SPLITS}, got {split!r}")
  problem = base.Problem(prompt=record["prompt"], answer=record["answer"], env=record["env"],
                         level=record["level"], uid=uid, data=_tuples(record.get("data", [])))
  return problem, split


def read_jsonl(path: str) -> Iterable[tuple[int, dict]]:
  """(line number, record) per non-blank line; DatasetError for a line that is not JSON."""
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        yield lineno, json.loads(line)
      except json.JSONDecodeError as e:
        raise DatasetError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno}): "
                           f"{line.strip()[:120]!r}") from None


READERS: dict[str, Callable[[str], Iterable[tuple[int, dict]]]] = {".jsonl": read_jsonl}


def write_jsonl(path: str, problems: Iterable[base.Problem], split: str | None = None) -> int:
  """Writes problems one JSON object a line; returns how many."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  count = 0
  with open(path, "w", encoding="utf-8") as f:
    for p in problems:
      f.write(json.dumps(problem_to_record(p, split), sort_keys=True) + "\n")
      count += 1
  return count


def write_dataset(path: str, env, key, n: int, *, level: int, split: str = "train",
                  **sample_kwargs) -> list[base.Problem]:
  """Draws ``n`` problems of ``level`` from ``split`` of ``env`` (an env or a registry name)
  with ``key`` and writes them to ``path`` (JSONL). Returns the problems."""
  env = _registry()[env] if isinstance(env, str) else env
  problems = env.sample(key, n, level=level, split=split, **sample_kwargs)
  write_jsonl(path, problems, split=split)
  return problems


class StaticDataset:
  """A fixed problem set read from ``path``; samples and verifies like an env."""

  def __init__(self, path: str, *, registry: Mapping | None = None, reader=None,
               check: bool = True):
    """``registry``: env name -> env used to verify (default ``envs.ENVS``). ``reader``: a
    ``path -> (line, record)`` iterable (default by suffix from ``READERS``). ``check``:
    also require every stored answer to verify to 1 under its env."""
    self.path = path
    self.name = f"static:{os.path.basename(path)}"
    self.registry = _registry() if registry is None else registry
    if reader is None:
      suffix = os.path.splitext(path)[1]
      if suffix not in READERS:
        raise DatasetError(f"{path}: no reader for {suffix!r}; readers: {sorted(READERS)}")
      if not os.path.exists(path):
        raise FileNotFoundError(f"no dataset file at {path!r}")
      reader = READERS[suffix]
    self.problems, self.splits = [], []
    for lineno, record in reader(path):
      problem, split = self._parse(lineno, record, check)
      self.problems.append(problem)
      self.splits.append(split)
    if not self.problems:
      raise DatasetError(f"{path}: no problems")
    self.levels = tuple(sorted({p.level for p in self.problems}))
    self.envs = tuple(sorted({p.env for p in self.problems}))
    self.eval_percent = getattr(self.registry[self.envs[0]], "eval_percent", 10)
    self.chars = "".join(sorted(set("".join(self.registry[e].chars for e in self.envs))))

  def _parse(self, lineno, record, check):
    where = f"{self.path}:{lineno}"
    try:
      problem, split = record_to_problem(record)
    except ValueError as e:
      raise DatasetError(f"{where}: {e}") from None
    env = self.registry.get(problem.env)
    if env is None:
      raise DatasetError(f"{where}: unknown env {problem.env!r}; valid env names: "
                         f"{', '.join(sorted(self.registry))}")
    if check:
      self._check(where, env, problem)
    if split is None:
      split = base.split_of(problem.uid, getattr(env, "eval_percent", 10))
    return problem, split

  @staticmethod
  def _check(where, env, problem):
    """The stored answer verifies, and (envs with ``rebuild``) prompt and answer are what the
    latent state ``data`` gives."""
    if hasattr(env, "rebuild"):
      try:
        canon = env.rebuild(problem)
      except Exception as e:  # pylint: disable=broad-except
        raise DatasetError(f"{where}: data {problem.data!r} is not a valid {problem.env} "
                           f"state ({type(e).__name__}: {e})") from None
      if (canon.prompt, canon.answer) != (problem.prompt, problem.answer):
        raise DatasetError(f"{where}: the stored answer {problem.answer!r} does not verify for "
                           f"prompt {problem.prompt!r} under env {problem.env!r} (its state "
                           f"gives {canon.prompt!r} -> {canon.answer!r})")
    if env.verify(problem, problem.answer) != 1.0:
      raise DatasetError(f"{where}: the stored answer {problem.answer!r} does not verify for "
                         f"prompt {problem.prompt!r} under env {problem.env!r}")

  def __len__(self) -> int:
    return len(self.problems)

  def pool(self, *, level: int | None = None, split: str = "train") -> list[base.Problem]:
    """The stored problems of ``split`` (and ``level`` unless None), in file order."""
    base.check_split(split)
    if level is not None and level not in self.levels:
      raise ValueError(f"{self.path} has no level {level}; levels: {list(self.levels)}")
    return [p for p, s in zip(self.problems, self.splits)
            if s == split and (level is None or p.level == level)]

  def sample(self, key, n: int, *, level: int | None = None,
             split: str = "train") -> list[base.Problem]:
    """``n`` stored problems: successive seeded permutations of the pool (so every problem is
    seen once before any repeats)."""
    pool = self.pool(level=level, split=split)
    if not pool:
      raise ValueError(f"{self.path} has no {split} problems"
                       + ("" if level is None else f" at level {level}"))
    rng = base.numpy_rng(key)
    order = []
    while len(order) < n:
      order.extend(rng.permutation(len(pool)).tolist())
    return [pool[i] for i in order[:n]]

  def verify(self, problem: base.Problem, completion) -> float:
    """The named env's exact verifier."""
    env = self.registry.get(getattr(problem, "env", None))
    if env is None:
      raise ValueError(f"{self.name}: no env {getattr(problem, 'env', None)!r} to verify with")
    return env.verify(problem, completion)

  def corpus(self, key, n: int, *, level: int | None = None,
             noise: float = 0.0) -> list[tuple[str, str]]:
    """``n`` (prompt, answer) pairs from the train pool; a fraction ``noise`` of answers is the
    named env's systematic mistake (envs with a ``wrong_answer(problem)`` method)."""
    if not 0.0 <= noise <= 1.0:
      raise ValueError(f"corpus noise must lie in [0, 1], got {noise}")
    problems = self.sample(key, n, level=level, split="train")
    flips = base.numpy_rng(jax.random.fold_in(key, 1)).random(n) < noise
    out = []
    for p, flip in zip(problems, flips):
      if flip:
        env = self.registry[p.env]
        if not hasattr(env, "wrong_answer"):
          raise ValueError(f"env {p.env!r} has no systematic wrong answer for a noisy corpus")
        out.append((p.prompt, env.wrong_answer(p)))
      else:
        out.append((p.prompt, p.answer))
    return out

  def _lengths(self, attr: str, level: int | None) -> int:
    values = [len(getattr(p, attr)) for p in self.problems if level is None or p.level == level]
    return max(values) if values else max(len(getattr(p, attr)) for p in self.problems)

  def max_prompt_chars(self, level: int | None = None) -> int:
    return self._lengths("prompt", level)

  def max_answer_chars(self, level: int | None = None) -> int:
    return self._lengths("answer", level)

  def __repr__(self) -> str:
    return f"StaticDataset({self.path!r}, n={len(self)}, envs={list(self.envs)})"


def split_counts(dataset: StaticDataset) -> dict[str, int]:
  return {s: int(np.sum([x == s for x in dataset.splits])) for s in base.SPLITS}
