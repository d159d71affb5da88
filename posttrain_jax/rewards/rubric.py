"""Prompt-level reward specification: rubric + executable constraints + a global score
(arXiv 2605.29275; methods_B.md section 13), the batched reward terms ``rubric``,
``rubric_sR``, ``rubric_sC`` and ``rubric_sG``.

Offline artefact per prompt (:class:`Artefact`), built ONCE from the prompt text alone by an
*artefact writer* (:data:`WRITERS`; a user's ``"module:function"`` too) and cached in
``run.cache`` and on disk (``WORKDIR/rubric/artefacts/<writer>/<sha256 of the prompt>.json``):

- rubric items ``(c_k, w_k)``: a requirement's text, its weight and the programmatic judge
  ``J(y, c_k) in [0, 1]`` that scores it (``judge``: a name of :data:`JUDGES` and its
  arguments; the paper's LLM judge stands behind this);
- checkers ``f_m``: Python SOURCE defining ``check(response) -> bool``, one pure function per
  hard constraint, executed in the sandbox (:mod:`~posttrain_jax.rewards.sandbox`).

The writer here (``instruct``, registered by ``envs/instruct.py``) is deterministic and
programmatic, standing in for the paper's LLM: it parses the ``instruct`` env's prompt.
Scores of a response y:

- ``s_R = sum_k w_k J(y, c_k) / sum_k w_k`` (:func:`rubric_score`; 1 when K = 0);
- ``s_C = (1/M) sum_m f_m(y)``, 1 when M = 0 (:func:`checker_scores`): every (row, checker)
  pair of a batch runs in ONE sandbox process; each call gets a fresh namespace and working
  directory and a per-call alarm; a checker that raises, hangs past ``check_s`` or returns a
  non-boolean fails that item with a reason (:attr:`CheckReport.reasons`);
- ``s_G = exp(mean log p_G(y | x))`` in (0, 1] under a small fixed scorer LM
  (:func:`global_scores`; by default the run's ``teacher`` stage, the policy's tokenizer);
- the hybrid *[derived weights]* ``r = (a s_R + b s_G + c s_C) / (a + b + c)``, default
  a = b = c = 1 *[ours]*, optionally gated ``r <- r * 1[s_C = 1]`` *[ours]* (:func:`hybrid`).

The three components of a batch are computed once (memoised on the batch in ``run.cache``):
the terms ``rubric_sR`` / ``rubric_sC`` / ``rubric_sG`` at weight 0 beside ``rubric`` log them
as ``reward/<name>`` at no extra cost.
"""

import dataclasses
import hashlib
import json
import math
import os
from typing import Callable

import numpy as np
from flax import nnx

from posttrain_jax import io as ptio
from posttrain_jax import models
from posttrain_jax.registry import ConfigError
from posttrain_jax.rewards import catalogue, cross_model, sandbox
from posttrain_jax.rewards.catalogue import REWARDS, RunInfo, batched

ARTEFACT_DIR = os.path.join("rubric", "artefacts")
SCORER_STAGE = "teacher"  # the run's stage whose final parameters are the global scorer


@dataclasses.dataclass(frozen=True)
class RubricItem:
  """One rubric item: its ``text`` (for a human or an LLM judge), ``weight`` (> 0) and the
  programmatic judge that scores it: ``judge`` (a :data:`JUDGES` name) with ``args``."""

  text: str
  weight: float
  judge: str
  args: tuple = ()


@dataclasses.dataclass(frozen=True)
class Checker:
  """One executable hard constraint: ``name`` and Python ``source`` defining
  ``check(response) -> bool`` (pure: the standard library only, no state between calls)."""

  name: str
  source: str


@dataclasses.dataclass(frozen=True)
class Artefact:
  """A prompt's offline artefact: its rubric ``items`` and ``checkers`` (either may be empty)."""

  prompt: str
  items: tuple = ()
  checkers: tuple = ()

  def to_json(self) -> dict:
    return {
      "prompt": self.prompt,
      "items": [[i.text, i.weight, i.judge, list(i.args)] for i in self.items],
      "checkers": [[c.name, c.source] for c in self.checkers],
    }

  @classmethod
  def from_json(cls, d: dict) -> "Artefact":
    return cls(
      d["prompt"],
      tuple(RubricItem(t, float(w), j, tuple(_tuple(a))) for t, w, j, a in d["items"]),
      tuple(Checker(n, s) for n, s in d["checkers"]),
    )


def _tuple(x):
  return tuple(_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


# -- the programmatic judge -------------------------------------------------------------------
def _words(response: str) -> list[str]:
  return response.split() if isinstance(response, str) else []


def judge_mentions(response: str, word: str) -> float:
  """1 iff ``word`` is one of the response's words."""
  return float(word in _words(response))


def judge_uses(response: str, words, enough: int) -> float:
  """``min(#distinct words of `words` used / enough, 1)``: graded credit for richness."""
  return min(len(set(words) & set(_words(response))) / enough, 1.0)


def judge_length(response: str, lo: int, hi: int) -> float:
  """1 inside ``lo..hi`` words, decaying linearly by ``1/lo`` per word outside (soft)."""
  n = len(_words(response))
  miss = max(lo - n, n - hi, 0)
  return max(0.0, 1.0 - miss / lo)


JUDGES: dict[str, Callable] = {
  "mentions": judge_mentions,
  "uses": judge_uses,
  "length": judge_length,
}


def judge(response: str, item: RubricItem) -> float:
  """``J(y, c_k)`` in [0, 1] of one rubric item."""
  if item.judge not in JUDGES:
    raise ConfigError(
      f"rubric item {item.text!r} names the unknown judge {item.judge!r}; "
      f"valid judges: {', '.join(sorted(JUDGES))}"
    )
  return float(np.clip(JUDGES[item.judge](response, *item.args), 0.0, 1.0))


# -- the artefact writer ----------------------------------------------------------------------
# Filled by the modules that define writers (``instruct``: ``envs/instruct.py``).
WRITERS: dict[str, Callable] = {}


def resolve_writer(spec: str) -> Callable:
  """The writer ``spec`` names: a :data:`WRITERS` name or ``"module:function"`` /
  ``"file.py:function"`` (``fn(prompt) -> Artefact``)."""
  if ":" in spec:
    return catalogue.resolve(spec, "config.reward.terms.rubric.kwargs.writer")
  if spec not in WRITERS:
    raise ConfigError(
      f"config.reward.terms.rubric.kwargs.writer: unknown artefact writer "
      f"{spec!r}; valid writers: {', '.join(sorted(WRITERS))} (import "
      "posttrain_jax.envs to register the envs' own), or 'module:function' "
      "returning a rubric.Artefact"
    )
  return WRITERS[spec]


def prompt_key(prompt: str) -> str:
  """The cache key of a prompt: the SHA-256 of its text."""
  return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


def artefact(prompt: str, run: RunInfo, writer: str = "instruct") -> Artefact:
  """The prompt's artefact: from ``run.cache``, else from disk under ``run.workdir``, else
  written by ``writer`` (once) and stored in both."""
  key = ("rubric_artefact", writer, prompt_key(prompt))
  found = run.cache.get(key)
  if found is not None:
    return found
  path = (
    os.path.join(
      run.workdir, ARTEFACT_DIR, writer.replace(os.sep, "_").replace(":", "_"), key[2] + ".json"
    )
    if run.workdir
    else ""
  )
  if path and os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      found = Artefact.from_json(json.load(f))
  else:
    found = resolve_writer(writer)(prompt)
    if not isinstance(found, Artefact):
      raise ConfigError(
        f"the artefact writer {writer!r} returned a {type(found).__name__}, not a rubric.Artefact"
      )
    if path:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(found.to_json(), f, indent=1)
      os.replace(path + ".tmp", path)
  run.cache[key] = found
  return found


# -- the scores -------------------------------------------------------------------------------
def rubric_score(response: str, art: Artefact) -> float:
  """``s_R = sum_k w_k J(y, c_k) / sum_k w_k`` (1 when the rubric is empty)."""
  total = sum(i.weight for i in art.items)
  if total <= 0:
    return 1.0
  return float(sum(i.weight * judge(response, i) for i in art.items) / total)


# Runs inside the sandbox: {"sources": [...], "calls": [[response, source index], ...],
# "check_s": s} on stdin; one JSON line [call, "ok", value] or [call, "error", why] per call.
HARNESS = """import json, os, signal, sys, tempfile
_p = json.loads(sys.stdin.read())
_out, sys.stdout = sys.stdout, sys.stderr
def _alarm(signum, frame):
  raise TimeoutError("over the per-check time limit")
signal.signal(signal.SIGALRM, _alarm)
_codes = []
for _s in _p["sources"]:
  try:
    _codes.append(compile(_s, "<checker>", "exec"))
  except BaseException as e:
    _codes.append(type(e).__name__ + ": " + str(e)[:100])
_home = os.getcwd()
for _i, (_resp, _k) in enumerate(_p["calls"]):
  try:
    if isinstance(_codes[_k], str):
      raise SyntaxError(_codes[_k])
    os.chdir(tempfile.mkdtemp(dir=_home))
    signal.setitimer(signal.ITIMER_REAL, _p["check_s"])
    try:
      _ns = {"__name__": "checker"}
      exec(_codes[_k], _ns)
      _v = _ns["check"](_resp)
    finally:
      signal.setitimer(signal.ITIMER_REAL, 0)
    if type(_v) is not bool:
      raise TypeError("returned a " + type(_v).__name__ + ", not a bool")
    _line = json.dumps([_i, "ok", _v])
  except BaseException as e:
    _line = json.dumps([_i, "error", type(e).__name__ + ": " + str(e)[:100]])
  _out.write(_line + "\\n")
  _out.flush()
"""


@dataclasses.dataclass(frozen=True)
class CheckReport:
  """The checkers' verdicts on a batch: ``passed[i]`` a tuple of bools (one per checker of row
  i's artefact), ``reasons[i]`` ``(checker name, why)`` for each one that failed to run (raised,
  timed out, non-boolean, no result), and the sandbox ``result``."""

  passed: tuple
  reasons: tuple
  result: sandbox.Result | None

  def scores(self) -> np.ndarray:
    """``[N]`` s_C: each row's pass fraction, 1 for a row with no checker."""
    return np.asarray([sum(p) / len(p) if p else 1.0 for p in self.passed], np.float64)


def checker_scores(
  responses,
  artefacts,
  limits: sandbox.Limits | None = None,
  *,
  check_s: float = 0.5,
  mode: str | None = None,
) -> CheckReport:
  """Runs every checker of every row's artefact on its response, all in ONE sandbox process
  (see the module docstring); a non-string response fails its checkers."""
  sources, index, calls, owner = [], {}, [], []
  for row, (resp, art) in enumerate(zip(responses, artefacts)):
    for m, chk in enumerate(art.checkers):
      if chk.source not in index:
        index[chk.source] = len(sources)
        sources.append(chk.source)
      if isinstance(resp, str):
        calls.append([resp, index[chk.source]])
        owner.append((row, m))
  got, result = {}, None
  if calls:
    payload = json.dumps({"sources": sources, "calls": calls, "check_s": check_s})
    result = sandbox.run(HARNESS, payload, limits or sandbox.Limits(), mode=mode)
    for line in result.stdout.splitlines():
      try:
        item = json.loads(line)
      except ValueError:
        continue
      if (
        isinstance(item, list)
        and len(item) == 3
        and type(item[0]) is int
        and 0 <= item[0] < len(calls)
      ):
        got.setdefault(item[0], (item[1], item[2]))
  by_row = {(r, m): c for c, (r, m) in enumerate(owner)}
  passed, reasons = [], []
  for row, (resp, art) in enumerate(zip(responses, artefacts)):
    ok, why = [], []
    for m, chk in enumerate(art.checkers):
      c = by_row.get((row, m))
      status, value = got.get(c, (None, None)) if c is not None else ("error", "not text")
      ok.append(status == "ok" and value is True)
      if status == "error":
        why.append((chk.name, str(value)))
      elif status is None:
        why.append((chk.name, f"no result: the sandbox run {result.status}: {result.reason}"))
    passed.append(tuple(ok))
    reasons.append(tuple(why))
  return CheckReport(tuple(passed), tuple(reasons), result)


def _scorer_config(stage_dir: str, vocab_size: int) -> models.ModelConfig:
  """The ModelConfig of a run's stage (its run's config.json: ``model``, with the teacher's
  ``preset`` / ``overrides`` for the ``teacher`` stage)."""
  run_dir = os.path.dirname(stage_dir)
  path = os.path.join(run_dir, "config.json")
  if not os.path.exists(path):
    raise ConfigError(
      f"the rubric's global scorer at {stage_dir!r} has no {path}; point "
      "kwargs scorer at a run's STAGE folder (e.g. RUN/teacher)"
    )
  with open(path, encoding="utf-8") as f:
    config = json.load(f)
  model = dict(config["model"])
  overrides = dict(model.get("overrides") or {})
  if os.path.basename(stage_dir) == SCORER_STAGE:
    teacher = config.get("rl", {}).get("teacher", {})
    model["preset"] = teacher.get("preset") or model["preset"]
    overrides.update(teacher.get("overrides") or {})
  overrides.setdefault("dtype", model.get("dtype", "float32"))
  overrides.setdefault("max_seq_len", model.get("max_seq_len", 256))
  return models.preset(model["preset"], vocab_size=vocab_size, **overrides)


def load_scorer(stage_dir: str, tokenizer) -> cross_model.Verifier:
  """The global scorer LM of a run's stage folder (``STAGE/final``), scoring with the run's
  ``tokenizer`` (it must be the one that stage was trained with)."""
  final = os.path.join(stage_dir, "final")
  if not os.path.isdir(final):
    raise ConfigError(
      f"the rubric's global scorer found no trained model at {final!r}; run the "
      "'teacher' stage first (config.stages, with config.rl.teacher.source="
      "'stage') or set kwargs scorer=<a run's STAGE folder>"
    )
  if tokenizer is None:
    raise ConfigError("the rubric's global scorer needs the run's tokenizer (RunInfo.tokenizer)")
  config = _scorer_config(stage_dir, len(tokenizer))
  graphdef, target = nnx.split(
    nnx.eval_shape(lambda: models.Decoder(config, rngs=nnx.Rngs(params=0)))
  )
  params, _ = ptio.checkpoint.restore_single_device(final, target)
  return cross_model.Verifier(graphdef, params, tokenizer, config.max_seq_len)


def global_scores(prompts, responses, run: RunInfo, scorer: str = "") -> np.ndarray:
  """``[N]`` s_G = exp(mean log-likelihood of the response after its prompt, EOS included)
  under the scorer LM (``scorer``: a run's stage folder; empty: this run's ``teacher``
  stage), loaded once per run into ``run.cache``."""
  stage_dir = os.path.abspath(scorer or os.path.join(run.workdir, SCORER_STAGE))
  key = ("rubric_scorer", stage_dir)
  model = run.cache.get(key)
  if model is None:
    model = run.cache[key] = load_scorer(stage_dir, run.tokenizer)
  texts = [r if isinstance(r, str) else "" for r in responses]
  return np.exp(np.minimum(np.asarray(model.score(list(prompts), texts), np.float64), 0.0))


def hybrid(
  s_r, s_g, s_c, a: float = 1.0, b: float = 1.0, c: float = 1.0, gate: bool = False
) -> np.ndarray:
  """``r = (a s_R + b s_G + c s_C) / (a + b + c)``, times ``1[s_C = 1]`` with ``gate``."""
  for name, w in (("a", a), ("b", b), ("c", c)):
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
      raise ConfigError(
        f"config.reward.terms.rubric.kwargs.{name} must be a finite number >= 0, got {w!r}"
      )
  if a + b + c <= 0:
    raise ConfigError(
      "config.reward.terms.rubric.kwargs a, b, c are all 0; give at least one "
      "a positive weight (a: rubric, b: global, c: checkers)"
    )
  s_r, s_g, s_c = (np.asarray(x, np.float64) for x in (s_r, s_g, s_c))
  r = (a * s_r + b * s_g + c * s_c) / (a + b + c)
  return r * (s_c >= 1.0) if gate else r


# -- the batched terms ------------------------------------------------------------------------
def components(
  problems,
  completions,
  run: RunInfo,
  *,
  writer: str = "instruct",
  scorer: str = "",
  need_global: bool = True,
  check_s: float = 0.5,
  cpu_s: float = 10.0,
  wall_s: float = 20.0,
  memory_mb: int = 256,
) -> dict:
  """``{"s_R", "s_C", "s_G": [N] arrays, "reasons": per-row checker failures}`` of a batch,
  memoised on the batch (its prompts and completions) in ``run.cache``; ``s_G`` is None
  unless ``need_global`` (or computed before)."""
  prompts = [p.prompt for p in problems]
  texts = list(completions)
  memo_key = hashlib.sha256(
    json.dumps([prompts, [str(t) for t in texts], writer, scorer]).encode("utf-8")
  ).hexdigest()
  memo = run.cache.get("rubric_batch")
  if memo is None or memo[0] != memo_key:
    arts = [artefact(p, run, writer) for p in prompts]
    limits = sandbox.Limits(cpu_s=cpu_s, wall_s=wall_s, memory_mb=memory_mb)
    report = checker_scores(texts, arts, limits, check_s=check_s)
    values = {
      "s_R": np.asarray(
        [rubric_score(t, a) if isinstance(t, str) else 0.0 for t, a in zip(texts, arts)], np.float64
      ),
      "s_C": report.scores(),
      "s_G": None,
      "reasons": report.reasons,
    }
    memo = run.cache["rubric_batch"] = (memo_key, values)
  values = memo[1]
  if need_global and values["s_G"] is None:
    values["s_G"] = global_scores(prompts, texts, run, scorer)
  return values


@batched
def rubric(
  problems,
  completions,
  *,
  run: RunInfo,
  a: float = 1.0,
  b: float = 1.0,
  c: float = 1.0,
  gate: bool = False,
  writer: str = "instruct",
  scorer: str = "",
  check_s: float = 0.5,
  cpu_s: float = 10.0,
  wall_s: float = 20.0,
  memory_mb: int = 256,
) -> np.ndarray:
  """The batched term ``rubric``: the hybrid ``(a s_R + b s_G + c s_C) / (a + b + c)`` (times
  ``1[s_C = 1]`` with ``gate``). ``writer``: the artefact writer (a ``WRITERS`` name or
  ``module:function``); ``scorer``: the global scorer, a run's stage folder (default this
  run's ``teacher``; not loaded when b = 0); ``check_s``: seconds per checker call;
  ``cpu_s``, ``wall_s``, ``memory_mb``: the sandbox run's limits (one run per batch)."""
  hybrid(0.0, 0.0, 0.0, a, b, c)  # checks the weights before any work
  v = components(
    problems,
    completions,
    run,
    writer=writer,
    scorer=scorer,
    need_global=b > 0,
    check_s=check_s,
    cpu_s=cpu_s,
    wall_s=wall_s,
    memory_mb=memory_mb,
  )
  s_g = v["s_G"] if v["s_G"] is not None else np.zeros(len(problems))
  return hybrid(v["s_R"], s_g, v["s_C"], a, b, c, gate)


@batched
def rubric_s_r(problems, completions, *, run: RunInfo, **kwargs) -> np.ndarray:
  """The batched term ``rubric_sR``: s_R alone (kwargs: ``rubric``'s but a, b, c, gate)."""
  return components(problems, completions, run, need_global=False, **kwargs)["s_R"]


@batched
def rubric_s_c(problems, completions, *, run: RunInfo, **kwargs) -> np.ndarray:
  """The batched term ``rubric_sC``: s_C alone, the checkers' pass fraction (kwargs as
  ``rubric_sR``'s)."""
  return components(problems, completions, run, need_global=False, **kwargs)["s_C"]


@batched
def rubric_s_g(problems, completions, *, run: RunInfo, **kwargs) -> np.ndarray:
  """The batched term ``rubric_sG``: s_G alone, the scorer LM's exp(mean log-likelihood)
  (kwargs as ``rubric_sR``'s)."""
  return components(problems, completions, run, **kwargs)["s_G"]


REWARDS["rubric"] = rubric
REWARDS["rubric_sR"] = rubric_s_r
REWARDS["rubric_sC"] = rubric_s_c
REWARDS["rubric_sG"] = rubric_s_g
