"""A verifier-anchored record of reasoning data (the primer on post-training reasoning data,
arXiv 2606.02113; methods_A.md section 15): what a training example is, how it was produced,
how it is checked and where it came from, in one JSON object per line.

    {"schema": 1,
     "prompt": "7+5*3=",
     "behaviour": {"completion": "7+5=2;2*3=6;#6",
                   "steps": [{"text": "7+5=2", "kind": "reasoning", "ok": true}, ...],
                   "tool_calls": [{"name": "calc", "args": "7+5", "result": "12", "ok": true}],
                   "failures": 0, "retries": 0},
     "check": {"kind": "rule", "granularity": "outcome", "verifier": "chain",
               "reference": "6", "score": 1.0},
     "provenance": {"source": "env", "source_model": "", "filters": [], "difficulty": 3,
                    "base_pass_rate": null, "env": "chain", "level": 3, "uid": "7+5*3=",
                    "data": [7, [["+", 5], ["*", 3]]], "split": "train"}}

- ``behaviour``: the trajectory: the completion text, its steps (each ``reasoning``,
  ``tool_call``, ``observation`` or ``answer``, with ``ok`` false for a failed step), the tool
  calls with their results, and counts of failures and retries (agent data keeps them).
- ``check``: the checking signal: its ``kind`` (``rule``: an exact verifier; ``environment``:
  an environment's terminal check; ``judge``: a human or model judge), its ``granularity``
  (``outcome``, ``step`` or ``action``), the verifier's name (a registered env or a rule of
  ``envs.static.RULES``), the reference answer and the recorded score (null: not scored).
- ``provenance``: ``source`` (``env``: generated, ``model``: a policy's sample, ``human``,
  ``dataset``), the source model (e.g. ``"policy@step 40"``), filters applied, a difficulty
  estimate, the base model's pass rate on the prompt, the env, level, uid, latent ``data`` and
  split the library's problems carry, and for a policy's sample the RL step that drew it.

:func:`validate` reads a dict into a :class:`Record` or raises ``RecordError`` naming the field
path and the fix; :func:`read_records` / :func:`write_records` do files (``path:LINE:`` in
errors). Converters: :func:`from_problem` / :func:`to_problem` (a dataset problem, its gold or
a sampled completion), :func:`to_pair` (an SFT example). ``envs.StaticDataset`` and the SFT
stage read record lines; ``config.rl.dump_rollouts`` writes the RL stage's rollouts as records
(methods/rollout_dump/).
"""

import dataclasses
import json
import os

from posttrain_jax.envs import base

SCHEMA = 1
CHECK_KINDS = ("rule", "environment", "judge")
GRANULARITIES = ("outcome", "step", "action")
STEP_KINDS = ("reasoning", "tool_call", "observation", "answer")
SOURCES = ("env", "model", "human", "dataset")


class RecordError(base.DatasetError):
  """A malformed reasoning-data record; the message names the field path and the fix."""


@dataclasses.dataclass(frozen=True)
class Step:
  text: str
  kind: str = "reasoning"
  ok: bool | None = None


@dataclasses.dataclass(frozen=True)
class ToolCall:
  name: str
  args: str = ""
  result: str = ""
  ok: bool | None = None


@dataclasses.dataclass(frozen=True)
class Behaviour:
  completion: str
  steps: tuple = ()
  tool_calls: tuple = ()
  failures: int = 0
  retries: int = 0


@dataclasses.dataclass(frozen=True)
class Check:
  kind: str
  granularity: str
  verifier: str
  reference: str
  score: float | None = None


@dataclasses.dataclass(frozen=True)
class Provenance:
  source: str
  env: str
  level: int
  uid: str
  source_model: str = ""
  filters: tuple = ()
  difficulty: float | None = None
  base_pass_rate: float | None = None
  data: tuple = ()
  split: str | None = None
  step: int | None = None


@dataclasses.dataclass(frozen=True)
class Record:
  prompt: str
  behaviour: Behaviour
  check: Check
  provenance: Provenance


def is_record(obj) -> bool:
  """Whether a JSON object uses this layout (it has ``behaviour`` and ``check``)."""
  return isinstance(obj, dict) and "behaviour" in obj and "check" in obj


def _need(obj, key: str, kind, path: str, *, optional: bool = False, default=None):
  if key not in obj:
    if optional:
      return default
    raise RecordError(f"{path}.{key} is missing; every record has it (see envs/records.py)")
  value = obj[key]
  if optional and value is None:
    return default
  ok = isinstance(value, kind) and not (
    kind in (int, float, (int, float)) and isinstance(value, bool)
  )
  if not ok:
    name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
    raise RecordError(f"{path}.{key} must be a {name}, got {value!r:.60}")
  return value


def _choice(value: str, allowed, path: str) -> str:
  if value not in allowed:
    raise RecordError(f"{path} is {value!r}; it must be one of {list(allowed)}")
  return value


def _tuples(value):
  return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def validate(obj, where: str = "record") -> Record:
  """A :class:`Record` from a JSON object, or ``RecordError`` naming the field and the fix."""
  if not isinstance(obj, dict):
    raise RecordError(f"{where}: a record is a JSON object, got {type(obj).__name__}")
  schema = obj.get("schema", SCHEMA)
  if schema != SCHEMA:
    raise RecordError(f"{where}: schema {schema!r} is not {SCHEMA}; this library reads {SCHEMA}")
  prompt = _need(obj, "prompt", str, where)
  b = _need(obj, "behaviour", dict, where)
  bp = f"{where}.behaviour"
  steps = tuple(
    Step(
      text=_need(s, "text", str, f"{bp}.steps[{i}]"),
      kind=_choice(
        _need(s, "kind", str, f"{bp}.steps[{i}]", optional=True, default="reasoning"),
        STEP_KINDS,
        f"{bp}.steps[{i}].kind",
      ),
      ok=_need(s, "ok", bool, f"{bp}.steps[{i}]", optional=True),
    )
    for i, s in enumerate(
      _dicts(_need(b, "steps", list, bp, optional=True, default=[]), f"{bp}.steps")
    )
  )
  calls = tuple(
    ToolCall(
      name=_need(c, "name", str, f"{bp}.tool_calls[{i}]"),
      args=_need(c, "args", str, f"{bp}.tool_calls[{i}]", optional=True, default=""),
      result=_need(c, "result", str, f"{bp}.tool_calls[{i}]", optional=True, default=""),
      ok=_need(c, "ok", bool, f"{bp}.tool_calls[{i}]", optional=True),
    )
    for i, c in enumerate(
      _dicts(_need(b, "tool_calls", list, bp, optional=True, default=[]), f"{bp}.tool_calls")
    )
  )
  counts = {k: _need(b, k, int, bp, optional=True, default=0) for k in ("failures", "retries")}
  for k, v in counts.items():
    if v < 0:
      raise RecordError(f"{bp}.{k} is {v}; a count is >= 0")
  behaviour = Behaviour(_need(b, "completion", str, bp), steps, calls, **counts)
  c = _need(obj, "check", dict, where)
  cp = f"{where}.check"
  score = _need(c, "score", (int, float), cp, optional=True)
  check = Check(
    kind=_choice(_need(c, "kind", str, cp), CHECK_KINDS, f"{cp}.kind"),
    granularity=_choice(_need(c, "granularity", str, cp), GRANULARITIES, f"{cp}.granularity"),
    verifier=_need(c, "verifier", str, cp),
    reference=_need(c, "reference", str, cp),
    score=None if score is None else float(score),
  )
  if not check.verifier:
    raise RecordError(f"{cp}.verifier is empty; name the env or rule that checks the record")
  p = _need(obj, "provenance", dict, where)
  pp = f"{where}.provenance"
  split = _need(p, "split", str, pp, optional=True)
  if split is not None and split not in base.SPLITS:
    raise RecordError(f"{pp}.split is {split!r}; it must be one of {list(base.SPLITS)}")
  rate = _need(p, "base_pass_rate", (int, float), pp, optional=True)
  if rate is not None and not 0.0 <= rate <= 1.0:
    raise RecordError(f"{pp}.base_pass_rate is {rate}; a pass rate lies in [0, 1]")
  filters = _need(p, "filters", list, pp, optional=True, default=[])
  if not all(isinstance(x, str) for x in filters):
    raise RecordError(f"{pp}.filters must be a list of strings (the filters' names)")
  difficulty = _need(p, "difficulty", (int, float), pp, optional=True)
  provenance = Provenance(
    source=_choice(_need(p, "source", str, pp), SOURCES, f"{pp}.source"),
    env=_need(p, "env", str, pp),
    level=_need(p, "level", int, pp),
    uid=_need(p, "uid", str, pp, optional=True, default=prompt),
    source_model=_need(p, "source_model", str, pp, optional=True, default=""),
    filters=tuple(filters),
    difficulty=None if difficulty is None else float(difficulty),
    base_pass_rate=None if rate is None else float(rate),
    data=_tuples(_need(p, "data", list, pp, optional=True, default=[])),
    split=split,
    step=_need(p, "step", int, pp, optional=True),
  )
  return Record(prompt, behaviour, check, provenance)


def _dicts(items: list, path: str) -> list:
  for i, x in enumerate(items):
    if not isinstance(x, dict):
      raise RecordError(f"{path}[{i}] must be a JSON object, got {x!r:.40}")
  return items


def to_json(record: Record) -> dict:
  """The record as a JSON object (:func:`validate` reads it back to an equal record)."""
  return json.loads(json.dumps({"schema": SCHEMA, **dataclasses.asdict(record)}))


def read_records(path: str) -> list[Record]:
  """The records of a JSONL file; ``RecordError`` naming ``path:LINE`` and the field."""
  if not os.path.isfile(path):
    raise RecordError(f"{path}: no such file; give a JSONL file of records (envs/records.py)")
  return [validate(obj, f"{path}:{lineno}") for lineno, obj in base.json_lines(path)]


def write_records(path: str, records, *, append: bool = False) -> int:
  """Writes (or appends) ``records`` as JSONL; returns how many."""
  n = 0
  with open(path, "a" if append else "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(to_json(r), sort_keys=True) + "\n")
      n += 1
  return n


def split_steps(completion: str, delimiter: str) -> tuple[Step, ...]:
  """The completion's steps at ``delimiter`` (empty: one step), the last one the answer."""
  parts = [p for p in completion.split(delimiter)] if delimiter else [completion]
  parts = [p for p in parts if p]
  return tuple(
    Step(p, "answer" if i == len(parts) - 1 else "reasoning") for i, p in enumerate(parts)
  )


def from_problem(
  problem: base.Problem,
  completion: str | None = None,
  *,
  score: float | None = None,
  source: str = "env",
  source_model: str = "",
  split: str | None = None,
  base_pass_rate: float | None = None,
  filters=(),
  delimiter: str = ";",
  kind: str = "rule",
  step: int | None = None,
  difficulty: float | None = None,
) -> Record:
  """A record of ``problem`` with ``completion`` (default its reference answer: gold data),
  checked by its env's verifier at the outcome; ``difficulty`` defaults to the level."""
  text = problem.answer if completion is None else completion
  return Record(
    prompt=problem.prompt,
    behaviour=Behaviour(text, split_steps(text, delimiter)),
    check=Check(kind, "outcome", problem.env, problem.answer, score),
    provenance=Provenance(
      source=source,
      env=problem.env,
      level=int(problem.level),
      uid=problem.uid,
      source_model=source_model,
      filters=tuple(filters),
      difficulty=float(problem.level) if difficulty is None else float(difficulty),
      base_pass_rate=base_pass_rate,
      data=problem.data,
      split=split,
      step=step,
    ),
  )


def to_problem(record: Record) -> tuple[base.Problem, str | None]:
  """(the record's problem, its split or None): what a dataset of records serves to RL."""
  p = record.provenance
  problem = base.Problem(
    prompt=record.prompt,
    answer=record.check.reference,
    env=record.check.verifier,
    level=p.level,
    uid=p.uid,
    data=p.data,
  )
  return problem, p.split


def to_pair(record: Record) -> tuple[str, str]:
  """(prompt, completion): what an SFT stage trains on."""
  return record.prompt, record.behaviour.completion
