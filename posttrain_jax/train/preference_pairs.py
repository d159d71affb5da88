"""Preference pairs for the ``reward_model`` stage: read from a JSONL file, or made from an env.

A pairs file holds one JSON object a line in TRL's explicit-prompt layout::

  {"prompt": "12+30=", "chosen": "42", "rejected": "32"}
  {"prompt": "7+5=", "chosen": "12", "rejected": "2", "margin": 1.5}

``prompt``, ``chosen`` and ``rejected`` are strings (the prompt is prepended to both
completions); ``margin`` (optional, a number, default 0) is subtracted from ``r_c - r_r`` in the
loss when ``config.reward_model.margin`` is True. Other fields are ignored. A malformed line
raises ``DatasetError`` starting with ``path:LINE:``.

Without a file, :func:`env_pairs` makes pairs from the run's env: the chosen completion is a
problem's reference answer, the rejected one the env's ``corrupt(problem, rng)`` (a plausible
wrong answer) where the env has one, else the answer with one character replaced by another of
the env's characters; a rejected completion the env's verifier scores as correct is dropped.
"""

import dataclasses
import math
import os

import numpy as np

from posttrain_jax.envs import base, static
from posttrain_jax.registry import ConfigError

DatasetError = base.DatasetError
FIELDS = ("prompt", "chosen", "rejected")


@dataclasses.dataclass(frozen=True)
class Pairs:
  """Preference pairs as parallel tuples (``margin``: 0.0 where the data gives none;
  ``where``: each pair's origin for messages, ``path:LINE`` or the env's name)."""

  prompt: tuple
  chosen: tuple
  rejected: tuple
  margin: tuple
  where: tuple

  def __len__(self) -> int:
    return len(self.prompt)

  def take(self, index) -> "Pairs":
    """The pairs at ``index`` (a sequence of positions)."""
    return Pairs(
      *(
        tuple(field[i] for i in index)
        for field in (self.prompt, self.chosen, self.rejected, self.margin, self.where)
      )
    )


def _record(record, where: str) -> tuple[str, str, str, float, str]:
  if not isinstance(record, dict):
    raise DatasetError(
      f"{where}: a pair is a JSON object with string fields 'prompt', "
      f"'chosen' and 'rejected', got a JSON {type(record).__name__}"
    )
  missing = [k for k in FIELDS if k not in record]
  if missing:
    raise DatasetError(
      f"{where}: missing field(s) {missing}; a pair has string fields "
      f"'prompt', 'chosen' and 'rejected' (and an optional number 'margin'), "
      f"found {sorted(record)}"
    )
  for k in FIELDS:
    if not isinstance(record[k], str):
      raise DatasetError(f"{where}: field {k!r} must be a string, got {record[k]!r}")
  margin = record.get("margin", 0.0)
  if not isinstance(margin, (int, float)) or isinstance(margin, bool) or not math.isfinite(margin):
    raise DatasetError(f"{where}: field 'margin' must be a finite number, got {margin!r}")
  if not record["chosen"] and not record["rejected"]:
    raise DatasetError(f"{where}: 'chosen' and 'rejected' are both empty")
  return record["prompt"], record["chosen"], record["rejected"], float(margin), where


def read_pairs(path: str, field: str = "config.reward_model.data") -> Pairs:
  """The pairs of a JSONL file; ConfigError (naming the setting ``field``) when it is missing,
  DatasetError (``path:LINE:``) for a malformed line or an empty file."""
  if not os.path.isfile(path):
    raise ConfigError(
      f"{field}={path!r}: no such file; give a JSONL file of "
      "{'prompt', 'chosen', 'rejected'} objects, or '' for pairs made from "
      "the env"
    )
  rows = [_record(record, f"{path}:{lineno}") for lineno, record in static.read_jsonl(path)]
  if not rows:
    raise DatasetError(
      f"{path}: no pairs (the file is empty); write one JSON object "
      "{'prompt', 'chosen', 'rejected'} a line"
    )
  return Pairs(*(tuple(col) for col in zip(*rows)))


def perturb(answer: str, chars: str, rng: np.random.Generator) -> str:
  """``answer`` with one character replaced by another of ``chars`` (an empty answer: one
  character of ``chars``)."""
  pool = sorted(set(chars))
  if not answer:
    return pool[int(rng.integers(len(pool)))]
  i = int(rng.integers(len(answer)))
  others = [c for c in pool if c != answer[i]] or pool
  return answer[:i] + others[int(rng.integers(len(others)))] + answer[i + 1 :]


def wrong_answer(env, problem, rng: np.random.Generator, tries: int = 8) -> str | None:
  """A completion ``env.verify`` scores below 1 for ``problem``: the env's ``corrupt`` where it
  has one, else :func:`perturb` of the reference answer; None when ``tries`` draws fail."""
  corrupt = getattr(env, "corrupt", None)
  for _ in range(tries):
    attempt = (
      corrupt(problem, rng) if corrupt is not None else perturb(problem.answer, env.chars, rng)
    )
    if attempt != problem.answer and env.verify(problem, attempt) < 1.0:
      return attempt
  return None


def env_pairs(
  env, key, n: int, *, level: int, split: str, field: str = "config.reward_model.data"
) -> Pairs:
  """Up to ``n`` pairs (reference answer, wrong answer) of ``split`` problems of ``env`` drawn
  from ``key``; ConfigError (pointing to the setting ``field`` for a file) when the env yields
  no pair."""
  problems = env.sample(key, n, level=level, split=split)
  rng = base.numpy_rng(key)
  rows = []
  for p in problems:
    wrong = wrong_answer(env, p, rng)
    if wrong is not None:
      rows.append((p.prompt, p.answer, wrong, 0.0, f"env {p.env} problem {p.uid!r}"))
  if not rows:
    raise ConfigError(
      f"env {getattr(env, 'name', env)!r} gave no preference pairs (no wrong "
      f"answer its verifier rejects); give a pairs file in {field}"
    )
  return Pairs(*(tuple(col) for col in zip(*rows)))


def split_pairs(pairs: Pairs, eval_fraction: float, seed: int) -> tuple[Pairs, Pairs]:
  """``(train, held-out)``: a seeded shuffle of ``pairs`` cut so that ``eval_fraction`` of
  them (at least one when the fraction is > 0, at most all but one) are held out."""
  if len(pairs) < 2 and eval_fraction > 0:
    raise ConfigError(
      f"config.reward_model.eval_fraction={eval_fraction:g} needs at least 2 "
      f"pairs (one to train on, one held out); the data has {len(pairs)}"
    )
  order = np.random.default_rng(seed).permutation(len(pairs))
  held = 0
  if eval_fraction > 0:
    held = min(max(1, int(round(eval_fraction * len(pairs)))), len(pairs) - 1)
  return pairs.take(order[held:].tolist()), pairs.take(order[:held].tolist())
