"""Static datasets: a fixed set of generated problems on disk, used like an env.

TRON's baseline is a static dataset of N instances instead of the online stream. Two formats:

* a TensorFlow-Datasets dataset in array_record format (a directory; ``tfds_data`` writes it with
  ``write_tfds_dataset`` and reads it through a TFDS data source and grain, without TensorFlow).
  A user's own TFDS dataset with ``prompt`` and ``answer`` string features plugs into the same
  reader (``StaticDataset.from_tfds``; ``tfds_data``'s docstring lists the features);
* JSONL, one problem a line (``write_dataset``)::

    {"prompt": "S25-27=", "answer": "-2", "env": "tron/sub", "level": 2, "uid": "S25-27=",
     "data": [2, 25, 27], "split": "train"}

A line may also be a reasoning-data record (envs/records.py: prompt, behaviour, check,
provenance), whose check's verifier names the env and whose reference is the answer. A
``.jsonl`` file may instead use the common question/answer layout of public math datasets
(:func:`qa_record_to_problem`), scored by the ``math`` rule (math-verify, see
:mod:`posttrain_jax.rewards.math_answers`)::

    {"question": "Tom has 3 apples ...", "answer": "... so 3 + 4 = 7.\\n#### 7"}   (GSM8K)
    {"problem": "Compute ...", "solution": "... $\\\\boxed{\\\\frac{1}{2}}$.", "level": "Level 3"}
    {"problem": "Compute ...", "answer": "\\\\frac{1}{2}"}                         (MATH-500)

``StaticDataset(path)`` (a ``.jsonl`` file or a TFDS dataset directory) reads either back with
the env protocol (``sample``, ``verify``, ``corpus``, ``levels``, ``chars``, ``max_prompt_chars``,
``max_answer_chars``); ``verify`` and the noisy corpus delegate to the env named on each record
(a registered env, or a verifier rule of ``RULES``: ``'exact'`` or ``'math'``). Sampling goes
through grain: a seeded global shuffle per epoch, epochs repeating with fresh seeds
(``stream``), so the same seed gives the same problems in the same order whatever the format. A
malformed record raises ``DatasetError`` naming the file and the line (``path:LINE:``) or the
TFDS split and index (``dir:train[INDEX]:``) and what is wrong with it. Readers are pluggable:
``READERS`` maps a file suffix (and ``'tfds'``, for a directory) to a function ``path ->
iterable of (location, record dict)``.
"""

import json
import os
from collections.abc import Callable, Iterable, Mapping

import jax
import numpy as np

from posttrain_jax.envs import base, catalogue, records, tfds_data
from posttrain_jax.rewards import math_answers

FIELDS = ("prompt", "answer", "env", "level", "uid", "data")


DatasetError = base.DatasetError  # re-exported: readers raise it


def _registry() -> Mapping:
  return catalogue.ENVS


class ExactMatch:
  """A verifier rule for problems that come from no registered env (e.g. a user's TFDS
  dataset): a completion scores 1 iff, whitespace-stripped, it equals the stored answer."""

  eval_percent = 10
  chars = ""  # a StaticDataset adds the characters of its own prompts and answers
  # The stored answer is the reference by definition: a StaticDataset cannot check it against
  # anything (it only refuses a blank one), unlike an env that rebuilds or recomputes it.
  answer_is_reference = True

  def __init__(self, name: str = "exact"):
    self.name = name

  def verify(self, problem: base.Problem, completion) -> float:
    if not isinstance(completion, str):
      return 0.0
    return float(completion.strip() == problem.answer.strip())


# Verifier rules a dataset record may name as its env besides the registered envs.
RULES = {"exact": ExactMatch(), "math": math_answers.MathAnswer()}

QA_PROMPTS = ("question", "problem")  # the prompt field of the question/answer layout
QA_UIDS = ("uid", "unique_id", "id")  # its uid field, if any (else the prompt)


def _verifiers() -> Mapping:
  """The default registry of a StaticDataset: the registered envs plus ``RULES``."""
  return {**RULES, **_registry()}


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
  problem = base.Problem(
    prompt=record["prompt"],
    answer=record["answer"],
    env=record["env"],
    level=record["level"],
    uid=uid,
    data=_tuples(record.get("data", [])),
  )
  return problem, split


def is_qa_record(record) -> bool:
  """Whether ``record`` uses the question/answer layout (no ``prompt``; a ``question`` or
  ``problem``)."""
  return (
    isinstance(record, dict) and "prompt" not in record and any(k in record for k in QA_PROMPTS)
  )


def qa_gold(record) -> str:
  """The gold answer of a question/answer record: a GSM8K ``answer`` -> the text after its last
  ``#### `` without thousands commas; another ``answer`` (a string or a number) -> itself (its
  last ``\\boxed{}`` if it has one); else the last ``\\boxed{}`` of ``solution``.
  ValueError saying what is missing."""
  answer = record.get("answer")
  if answer is not None:
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
      raise ValueError(f"field 'answer' must be a string or a number, got {answer!r}")
    answer = str(answer)
    if "####" in answer:
      return answer.rsplit("####", 1)[1].strip().replace(",", "")
    return math_answers.last_boxed(answer) or answer.strip()
  solution = record.get("solution")
  if solution is None:
    raise ValueError("missing field 'answer' (or a 'solution' with a \\boxed{} answer)")
  if not isinstance(solution, str):
    raise ValueError(f"field 'solution' must be a string, got {solution!r}")
  gold = math_answers.last_boxed(solution)
  if gold is None:
    raise ValueError(
      "field 'solution' has no \\boxed{...} answer; give the gold in an 'answer' field"
    )
  return gold


def _qa_level(value) -> int:
  """A record's level: an integer, or MATH's ``"Level 3"``; 0 when absent or unknown
  (MATH's ``"Level ?"``)."""
  if isinstance(value, int) and not isinstance(value, bool):
    return value
  if isinstance(value, str):
    digits = value.removeprefix("Level").strip()
    return int(digits) if digits.isdigit() else 0
  if value is None:
    return 0
  raise ValueError(f"field 'level' must be an integer or a string such as 'Level 3', got {value!r}")


def qa_record_to_problem(record: dict) -> tuple[base.Problem, str | None]:
  """(Problem, split or None) from a question/answer record: prompt = ``question`` (or
  ``problem``), answer = :func:`qa_gold`, env = the record's ``env`` or ``'math'``, level from
  ``level``, uid = ``uid`` / ``unique_id`` / ``id`` (an integer id as a string) or the prompt.
  ValueError saying what is wrong."""
  field = next(k for k in QA_PROMPTS if k in record)
  prompt = record[field]
  if not isinstance(prompt, str):
    raise ValueError(f"field {field!r} must be a string, got {prompt!r}")
  env = record.get("env", "math")
  if not isinstance(env, str):
    raise ValueError(f"field 'env' must be a string, got {env!r}")
  key = next((k for k in QA_UIDS if k in record), None)
  uid = prompt if key is None else record[key]
  if isinstance(uid, int) and not isinstance(uid, bool):
    uid = str(uid)
  if not isinstance(uid, str):
    raise ValueError(f"field {key!r} must be a string or an integer, got {uid!r}")
  split = record.get("split")
  if split is not None and split not in base.SPLITS:
    raise ValueError(f"field 'split' must be one of {base.SPLITS}, got {split!r}")
  problem = base.Problem(
    prompt=prompt,
    answer=qa_gold(record),
    env=env,
    level=_qa_level(record.get("level")),
    uid=uid,
    data=(),
  )
  return problem, split


read_jsonl = base.json_lines  # (line number, record) per non-blank line


def read_tfds(path: str) -> Iterable[tuple[str, dict]]:
  """(``'<split>[<index>]'``, record) per example of the TFDS dataset directory ``path``."""
  return tfds_data.read_tfds(path)


# File suffix -> reader; 'tfds' reads a directory (a TFDS dataset).
READERS: dict[str, Callable[[str], Iterable[tuple[int | str, dict]]]] = {
  ".jsonl": read_jsonl,
  "tfds": read_tfds,
}


def write_jsonl(path: str, problems: Iterable[base.Problem], split: str | None = None) -> int:
  """Writes problems one JSON object a line; returns how many."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  count = 0
  with open(path, "w", encoding="utf-8") as f:
    for p in problems:
      f.write(json.dumps(problem_to_record(p, split), sort_keys=True) + "\n")
      count += 1
  return count


def write_dataset(
  path: str, env, key, n: int, *, level: int, split: str = "train", **sample_kwargs
) -> list[base.Problem]:
  """Draws ``n`` problems of ``level`` from ``split`` of ``env`` (an env or a registry name)
  with ``key`` and writes them to ``path`` (JSONL). Returns the problems. ``write_tfds_dataset``
  writes the same problems as a TFDS dataset."""
  env = _registry()[env] if isinstance(env, str) else env
  problems = env.sample(key, n, level=level, split=split, **sample_kwargs)
  write_jsonl(path, problems, split=split)
  return problems


def write_tfds_dataset(
  out_dir: str,
  env,
  key,
  n: int,
  *,
  level: int,
  split: str = "train",
  overwrite: bool = False,
  **sample_kwargs,
) -> list[base.Problem]:
  """``write_dataset`` into the TFDS (array_record) dataset directory ``out_dir``: adds split
  ``split`` (``overwrite``: first remove a dataset already there). Returns the problems."""
  return tfds_data.write_tfds_dataset(
    out_dir, env, key, n, level=level, split=split, overwrite=overwrite, **sample_kwargs
  )


def _seed(key) -> int:
  """A grain shuffle seed (in [0, 2**32)) from a JAX key."""
  return int(base.numpy_rng(key).integers(0, 2**32, dtype=np.uint64))


class StaticDataset:
  """A fixed problem set read from ``path``; samples and verifies like an env."""

  def __init__(
    self, path: str, *, registry: Mapping | None = None, reader=None, check: bool = True
  ):
    """``path``: a ``.jsonl`` file or a TFDS dataset directory. ``registry``: env name -> env
    used to verify (default ``envs.ENVS`` plus ``RULES``). ``reader``: a ``path -> (location,
    record)`` iterable (default ``READERS['tfds']`` for a directory, else by suffix from
    ``READERS``). ``check``: also require every stored answer to verify to 1 under its env."""
    self.path = path
    self.name = f"static:{os.path.basename(os.path.normpath(path))}"
    self.registry = _verifiers() if registry is None else registry
    if reader is None and os.path.isdir(path):
      reader = READERS["tfds"]
    if reader is None:
      suffix = os.path.splitext(path)[1]
      if not suffix and not os.path.exists(path):
        raise FileNotFoundError(f"no dataset file or TFDS dataset directory at {path!r}")
      if suffix not in READERS:
        raise DatasetError(
          f"{path}: no reader for {suffix!r}; readers: {sorted(READERS)} "
          "('tfds': a TFDS dataset directory)"
        )
      if not os.path.exists(path):
        raise FileNotFoundError(f"no dataset file at {path!r}")
      reader = READERS[suffix]
    self.problems, self.splits = [], []
    for lineno, record in reader(path):
      problem, split = self._parse(lineno, record, check)
      self.problems.append(problem)
      self.splits.append(split)
    if not self.problems:
      raise DatasetError(
        f"{path}: no problems (the dataset is empty); write one JSON object "
        "a line, e.g. with envs.static.write_dataset"
      )
    self.levels = tuple(sorted({p.level for p in self.problems}))
    self.envs = tuple(sorted({p.env for p in self.problems}))
    self.eval_percent = getattr(self.registry[self.envs[0]], "eval_percent", 10)
    own = set("".join(p.prompt + p.answer for p in self.problems))
    env_chars = set("".join(getattr(self.registry[e], "chars", "") for e in self.envs))
    self.chars = "".join(sorted(env_chars | own))

  @classmethod
  def from_tfds(
    cls,
    dir_or_name: str,
    *,
    data_dir: str | None = None,
    splits: Mapping[str, str] | None = None,
    env: str | None = None,
    level: int = 0,
    registry: Mapping | None = None,
    check: bool = True,
  ) -> "StaticDataset":
    """A TFDS dataset (array_record) as a static dataset: ``dir_or_name`` a dataset directory
    (or a folder with one below it) or a name (``'my_ds'``, ``'my_ds:1.0.0'``) in ``data_dir``.
    ``splits``: TFDS split -> 'train'/'eval' (default train->train, eval/test/validation->eval).
    ``env``: the env or verifier rule (e.g. ``'exact'``) for a dataset without an ``env``
    feature; ``level``: the level of a dataset without a ``level`` feature."""

    def reader(path):
      return tfds_data.read_tfds(path, data_dir=data_dir, splits=splits, env=env, level=level)

    return cls(dir_or_name, registry=registry, reader=reader, check=check)

  def _parse(self, lineno, record, check):
    where = f"{self.path}:{lineno}"
    if records.is_record(record):  # a reasoning-data record (envs/records.py)
      problem, split = records.to_problem(records.validate(record, where))
      return self._known(where, problem, split, check)
    qa = is_qa_record(record)
    try:
      problem, split = qa_record_to_problem(record) if qa else record_to_problem(record)
    except ValueError as e:
      layout = (
        "a question/answer record is a JSON object with a string 'question' (or "
        "'problem') and an 'answer' (GSM8K: after '#### ') or a 'solution' with a "
        "\\boxed{} answer"
        if qa
        else "a record is a JSON object with string fields 'prompt', 'answer', 'env' and an "
        "integer 'level' (optional: 'uid', 'data', 'split'), or a question/answer "
        "record ('question' or 'problem', and 'answer' or 'solution')"
      )
      raise DatasetError(f"{where}: {e}; {layout}") from None
    return self._known(where, problem, split, check)

  def _known(self, where, problem, split, check):
    """(problem, split) of a parsed record whose env is registered (checked with ``check``),
    the split from the uid when the record gives none."""
    env = self.registry.get(problem.env)
    if env is None:
      raise DatasetError(
        f"{where}: unknown env {problem.env!r}; valid env names: {', '.join(sorted(self.registry))}"
      )
    if check:
      self._check(where, env, problem)
    if split is None:
      split = base.split_of(problem.uid, getattr(env, "eval_percent", 10))
    return problem, split

  @staticmethod
  def _check(where, env, problem):
    """The stored answer is not blank; (envs with ``rebuild``) prompt and answer are what the
    latent state ``data`` gives; the stored answer verifies (an env that recomputes the answer,
    e.g. countdown). A verifier rule with ``answer_is_reference`` (``'exact'``) has nothing
    to check the answer against."""
    if not problem.answer.strip():
      raise DatasetError(
        f"{where}: the stored answer is blank; every record needs the answer its prompt should get"
      )
    if getattr(env, "answer_is_reference", False):
      return
    levels = tuple(getattr(env, "levels", ()) or ())
    if levels and problem.level not in levels:
      raise DatasetError(
        f"{where}: level {problem.level} is not a level of env "
        f"{problem.env!r}; its levels: {list(levels)}"
      )
    if hasattr(env, "rebuild"):
      try:
        canon = env.rebuild(problem)
      except Exception as e:  # pylint: disable=broad-except
        raise DatasetError(
          f"{where}: data {problem.data!r} is not a valid {problem.env} "
          f"state ({type(e).__name__}: {e})"
        ) from None
      if (canon.prompt, canon.answer) != (problem.prompt, problem.answer):
        raise DatasetError(
          f"{where}: the stored answer {problem.answer!r} does not verify for "
          f"prompt {problem.prompt!r} under env {problem.env!r} (its state "
          f"gives {canon.prompt!r} -> {canon.answer!r})"
        )
    try:
      score = env.verify(problem, problem.answer)
    except Exception as e:  # pylint: disable=broad-except
      raise DatasetError(
        f"{where}: env {problem.env!r} cannot verify this record "
        f"({type(e).__name__}: {e}); check its 'data' field"
      ) from None
    if score != 1.0:
      raise DatasetError(
        f"{where}: the stored answer {problem.answer!r} does not verify for "
        f"prompt {problem.prompt!r} under env {problem.env!r}"
      )

  def __len__(self) -> int:
    return len(self.problems)

  def pool(self, *, level: int | None = None, split: str = "train") -> list[base.Problem]:
    """The stored problems of ``split`` (and ``level`` unless None), in file order."""
    base.check_split(split)
    if level is not None and level not in self.levels:
      raise ValueError(f"{self.path} has no level {level}; levels: {list(self.levels)}")
    return [
      p
      for p, s in zip(self.problems, self.splits)
      if s == split and (level is None or p.level == level)
    ]

  def stream(
    self,
    seed: int,
    *,
    level: int | None = None,
    split: str = "train",
    num_epochs: int | None = None,
  ):
    """The pool as a grain ``MapDataset``: epoch after epoch (``num_epochs``, None for ever),
    each a global shuffle seeded by ``seed`` and the epoch number. Random access: element ``i``
    is the same for a given seed, so a trainer resumes a run from its step
    (``[stream[i] for i in range(step * batch, (step + 1) * batch)]``)."""
    import grain  # pylint: disable=import-outside-toplevel

    pool = self.pool(level=level, split=split)
    if not pool:
      raise DatasetError(
        f"{self.path} has no {split} problems"
        + ("" if level is None else f" at level {level}")
        + f"; give records \"split\": \"{split}\" (or no split field: a "
        "stable share of uids then goes to eval, the rest to train)"
      )
    return grain.MapDataset.source(pool).shuffle(seed=int(seed) % 2**32).repeat(num_epochs)

  def sample(
    self, key, n: int, *, level: int | None = None, split: str = "train"
  ) -> list[base.Problem]:
    """``n`` stored problems: the first ``n`` of ``stream`` seeded from ``key`` (successive
    seeded permutations of the pool, so every problem is seen once before any repeats)."""
    stream = self.stream(_seed(key), level=level, split=split)
    return [stream[i] for i in range(n)]

  def verify(self, problem: base.Problem, completion) -> float:
    """The named env's exact verifier."""
    env = self.registry.get(getattr(problem, "env", None))
    if env is None:
      raise ValueError(f"{self.name}: no env {getattr(problem, 'env', None)!r} to verify with")
    return env.verify(problem, completion)

  def corpus(
    self, key, n: int, *, level: int | None = None, noise: float = 0.0
  ) -> list[tuple[str, str]]:
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
