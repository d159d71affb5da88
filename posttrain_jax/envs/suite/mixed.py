"""The online multi-environment stream: a weighted mix of (env, level) pairs.

A mix is a list of ``(env_name, level, weight)`` entries (``curriculum.mix(state)`` returns one;
a dict ``{env_name: level}`` or ``{env_name: (level, weight)}`` is accepted too). Without a mix
every member env is drawn with equal weight at ``level`` clipped to that env's own levels, so
``sample(key, n, level=L, split=...)`` works exactly like a single env for a trainer that knows
nothing of mixes. ``verify`` dispatches on ``problem.env``.
"""

from collections.abc import Mapping, Sequence

import jax
import numpy as np

from posttrain_jax.envs import base

MIX_STREAM = 0x6D6978  # fold_in tag of the draw that picks the entry of every problem


def clip_level(env, level: int) -> int:
  """``level`` clipped into ``env.levels`` (ordered ascending)."""
  return min(max(int(level), env.levels[0]), env.levels[-1])


class MixedEnv:
  """Samples from several envs by a weighted (env, level) mix; an env in its own right."""

  def __init__(self, members, *, name: str = "tron", mix=None, eval_percent: int = 10):
    """``members``: env objects (or a name -> env mapping). ``mix``: a default mix used when
    ``sample``/``corpus`` get none (see ``with_mix``)."""
    if isinstance(members, Mapping):
      members = list(members.values())
    self.envs = {e.name: e for e in members}
    if not self.envs:
      raise ValueError("a MixedEnv needs at least one member env")
    self.name = name
    self.eval_percent = eval_percent
    self.levels = tuple(range(1, max(e.levels[-1] for e in self.envs.values()) + 1))
    self.chars = "".join(sorted(set("".join(e.chars for e in self.envs.values()))))
    self.default_mix = None if mix is None else self.normalize_mix(mix)

  def with_mix(self, mix) -> "MixedEnv":
    """A copy whose ``sample``/``corpus`` use ``mix`` unless given another one."""
    return MixedEnv(
      list(self.envs.values()), name=self.name, mix=mix, eval_percent=self.eval_percent
    )

  def uniform_mix(self, level: int) -> list[tuple[str, int, float]]:
    return [(name, clip_level(env, level), 1.0) for name, env in self.envs.items()]

  def normalize_mix(self, mix) -> list[tuple[str, int, float]]:
    """Validated ``[(env_name, level, weight)]`` from a list of triples or a dict."""
    if isinstance(mix, Mapping):
      items = [(k, *(v if isinstance(v, Sequence) else (v, 1.0))) for k, v in mix.items()]
    else:
      items = [tuple(e) for e in mix]
    out = []
    for entry in items:
      if len(entry) != 3:
        raise ValueError(f"a mix entry is (env_name, level, weight), got {entry!r}")
      name, level, weight = entry
      if name not in self.envs:
        raise ValueError(f"mix names unknown env {name!r}; valid: {', '.join(sorted(self.envs))}")
      if int(level) not in self.envs[name].levels:
        raise ValueError(f"{name} has no level {level}; valid: {list(self.envs[name].levels)}")
      if not np.isfinite(weight) or weight < 0:
        raise ValueError(f"mix weight of {name} must be finite and >= 0, got {weight}")
      out.append((name, int(level), float(weight)))
    if not out or sum(w for _, _, w in out) <= 0:
      raise ValueError("a mix needs at least one entry with positive weight")
    return out

  def _resolve(self, level, mix):
    if mix is not None:
      return self.normalize_mix(mix)
    if self.default_mix is not None:
      return self.default_mix
    if level is None:
      raise ValueError(f"{self.name}: give a level or a mix")
    if int(level) not in self.levels:
      raise ValueError(
        f"{self.name} level must be in {self.levels[0]}..{self.levels[-1]}, got {level}"
      )
    return self.uniform_mix(level)

  def _allocate(self, key, n: int, entries) -> np.ndarray:
    """Entry index of each of the ``n`` problems (a seeded categorical draw)."""
    weights = np.asarray([w for _, _, w in entries], dtype=np.float64)
    rng = base.numpy_rng(jax.random.fold_in(key, MIX_STREAM))
    return rng.choice(len(entries), size=n, p=weights / weights.sum())

  def _gather(self, key, n, entries, draw):
    picks = self._allocate(key, n, entries)
    out = [None] * n
    for i, (name, level, _) in enumerate(entries):
      slots = np.flatnonzero(picks == i)
      if len(slots):
        for slot, item in zip(
          slots, draw(self.envs[name], jax.random.fold_in(key, i), len(slots), level)
        ):
          out[slot] = item
    return out

  def sample(
    self, key, n: int, *, level: int | None = None, split: str = "train", mix=None
  ) -> list[base.Problem]:
    """``n`` problems from ``split``: each picks an (env, level) entry of the mix by weight."""
    base.check_split(split)
    entries = self._resolve(level, mix)
    return self._gather(
      key, n, entries, lambda env, k, m, lvl: env.sample(k, m, level=lvl, split=split)
    )

  def verify(self, problem: base.Problem, completion) -> float:
    """The member env's exact verifier (``problem.env`` names it)."""
    env = self.envs.get(getattr(problem, "env", None))
    if env is None:
      raise ValueError(
        f"{self.name} cannot verify a problem of env "
        f"{getattr(problem, 'env', None)!r}; members: {', '.join(self.envs)}"
      )
    return env.verify(problem, completion)

  def corpus(
    self, key, n: int, *, level: int | None = None, noise: float = 0.0, mix=None
  ) -> list[tuple[str, str]]:
    """``n`` (prompt, answer) pretraining pairs from the mix (each member's own corpus)."""
    entries = self._resolve(level, mix)
    return self._gather(
      key, n, entries, lambda env, k, m, lvl: env.corpus(k, m, level=lvl, noise=noise)
    )

  def max_prompt_chars(self, level: int | None = None) -> int:
    """The longest prompt of any member at any level (a curriculum may move levels later)."""
    return max(e.max_prompt_chars(l) for e in self.envs.values() for l in e.levels)

  def max_answer_chars(self, level: int | None = None) -> int:
    return max(e.max_answer_chars(l) for e in self.envs.values() for l in e.levels)

  def env_levels(self) -> dict[str, list[int]]:
    """Member name -> its levels (what ``curriculum.init`` takes)."""
    return {name: list(env.levels) for name, env in self.envs.items()}

  def __repr__(self) -> str:
    return f"MixedEnv(name={self.name!r}, envs={list(self.envs)})"
