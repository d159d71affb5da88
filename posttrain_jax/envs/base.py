"""Problems, splits and the shared machinery of procedural verifiable tasks."""

import dataclasses
import hashlib
import json
from collections.abc import Iterator

import jax
import numpy as np

SPLITS = ("train", "eval")


class DatasetError(ValueError):
  """A malformed dataset record; the message starts with ``path:line:``."""


@dataclasses.dataclass(frozen=True)
class Problem:
  """A prompt plus what its verifier needs. Host side, never inside jit.

  Attributes:
    prompt: the text the model continues.
    answer: the reference answer (a solution for tasks with many correct answers).
    env: name of the environment that made it.
    level: difficulty level.
    uid: canonical identity; two problems with the same uid are the same problem.
    data: task-specific fields the verifier reads (e.g. countdown's numbers and target).
  """

  prompt: str
  answer: str
  env: str
  level: int
  uid: str
  data: tuple = ()


def json_lines(path: str) -> Iterator[tuple[int, dict]]:
  """(line number, record) per non-blank line; DatasetError for a line that is not UTF-8 JSON."""
  with open(path, "rb") as f:
    for lineno, raw in enumerate(f, start=1):
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise DatasetError(
          f"{path}:{lineno}: not UTF-8 text (byte {raw[e.start]:#04x} at "
          f"column {e.start + 1}); a .jsonl dataset holds one UTF-8 JSON "
          "object a line"
        ) from None
      if not line.strip():
        continue
      try:
        yield lineno, json.loads(line)
      except json.JSONDecodeError as e:
        raise DatasetError(
          f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno}): {line.strip()[:120]!r}"
        ) from None


def split_of(uid: str, eval_percent: int) -> str:
  """'eval' for a stable ``eval_percent``% of uids (by SHA-1), else 'train'. Disjoint by design."""
  h = int.from_bytes(hashlib.sha1(uid.encode()).digest()[:8], "little")
  return "eval" if h % 100 < eval_percent else "train"


def numpy_rng(key: jax.Array) -> np.random.Generator:
  """A numpy Generator seeded deterministically from a JAX key (host-side generation)."""
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  seed = np.asarray(key, dtype=np.uint32).ravel().tolist()
  return np.random.Generator(np.random.PCG64(seed))


class GeneratedEnv:
  """The scaffolding a procedural env shares: a subclass sets ``name``, ``levels`` (a tuple of
  ints), ``eval_percent`` and ``_draw(rng, level) -> Problem``; this gives the level check and
  ``sample`` (draws until ``n`` problems fall in the split)."""

  name: str
  levels: tuple
  eval_percent: int

  def _check_level(self, level: int) -> None:
    if level not in self.levels:
      lo, hi = min(self.levels), max(self.levels)
      valid = f"{lo}..{hi}" if tuple(self.levels) == tuple(range(lo, hi + 1)) else self.levels
      raise ValueError(f"{self.name} level must be in {valid}, got {level}")

  def sample(self, key, n: int, *, level: int, split: str = "train") -> list[Problem]:
    """``n`` problems of ``level`` from ``split``, drawn from ``key``."""
    self._check_level(level)
    return sample_until(numpy_rng(key), n, lambda r: self._draw(r, level), split, self.eval_percent)


def check_split(split: str) -> None:
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")


def sample_until(
  rng: np.random.Generator, n: int, draw, split: str, eval_percent: int, max_tries: int = 1000
) -> list[Problem]:
  """Draws problems with ``draw(rng) -> Problem`` until ``n`` of them fall in ``split``."""
  check_split(split)
  out = []
  for _ in range(max_tries * max(n, 1)):
    if len(out) == n:
      return out
    p = draw(rng)
    if split_of(p.uid, eval_percent) == split:
      out.append(p)
  raise RuntimeError(f"could not draw {n} {split} problems; the level may be too small")
