"""Where each RL step's candidate prompts come from (host side; DESIGN.md section 3, step 1).

Three sources, chosen by config:

- the env itself (``config.env.name`` at ``config.env.level``): a fresh seeded draw per step;
- a static dataset (``config.env.dataset``: a ``.jsonl`` file or a TFDS array_record dataset
  directory, :class:`posttrain_jax.envs.StaticDataset`, or a method's curated pool, e.g. the
  pass-rate band's): its train split in epochs, one seeded permutation per epoch (grain),
  ``P`` prompts a step in order, so every prompt is seen once per epoch and a resumed run
  continues the same order (``consumed`` is checkpointed);
- an online mixed env with a curriculum (``config.rl.curriculum.enabled``, env ``tron`` or
  ``tron:<bucket>``): each step draws from ``curriculum.mix(state)`` and every scored rollout
  updates the per-env level windows (:mod:`posttrain_jax.envs.curriculum`).

The source's state is a JSON-safe dict kept in the RL checkpoint's meta.
"""

import jax

from posttrain_jax import envs, streams
from posttrain_jax.envs import curriculum as curriculum_lib
from posttrain_jax.registry import ConfigError

DATASET_STREAM = 0x5D5  # fold_in tag of the static dataset's shuffle seed


def load_dataset(config):
  """The static dataset of ``config.env.dataset`` (None when unset); clear errors for a missing
  or malformed file (``envs.static.DatasetError`` names the line)."""
  path = config.env.dataset
  if not path:
    return None
  return envs.StaticDataset(path)


def curriculum_kwargs(cfg) -> dict:
  section = cfg.curriculum
  if section is None or not section.enabled:
    return {}
  return {k: v for k, v in section.to_dict().items() if k != "enabled"}


class PromptSource:
  """Candidates for each step: ``candidates(key, n)``; ``observe(problems, rewards)`` after
  scoring; ``state_dict`` / ``load_state_dict`` for the checkpoint."""

  def __init__(self, config, env, dataset=None, *, all_levels: bool = False):
    self.env, self.dataset = env, dataset
    self.level = config.env.level
    self.seed = config.seed
    kwargs = curriculum_kwargs(config.rl)
    self.curriculum = None
    if kwargs:  # validate.py checked the env, the dataset and the settings
      start = kwargs.pop("start", 0)
      self.curriculum = curriculum_lib.init(env.env_levels(), start=start or None, **kwargs)
    self.consumed = 0
    self._stream, self._pool_len = None, 0
    if dataset is not None:
      # A dataset holding ``env.level`` serves that level alone, unless ``all_levels`` (a
      # method's curated pool, train/hooks.py ``prompts``).
      level = self.level if self.level in dataset.levels and not all_levels else None
      self._pool_len = len(dataset.pool(level=level, split="train"))
      self._stream = dataset.stream(
        self.seed * 1000003 + DATASET_STREAM, level=level, split="train"
      )

  def candidates(self, key, n: int) -> list:
    """``n`` training prompts for this draw (advances the dataset position)."""
    if self._stream is not None:
      out = [self._stream[self.consumed + i] for i in range(n)]
      self.consumed += n
      return out
    if self.curriculum is not None:
      return self.env.sample(key, n, mix=curriculum_lib.mix(self.curriculum), split="train")
    return self.env.sample(key, n, level=self.level, split="train")

  @property
  def epoch(self) -> float:
    """Passes over the dataset's train pool so far (0 without a dataset)."""
    return self.consumed / self._pool_len if self._pool_len else 0.0

  @property
  def verifier(self):
    """What scores this source's problems (``verify(problem, completion)``): the dataset (by
    each record's env name) or the env."""
    return self.dataset if self.dataset is not None else self.env

  def verify(self, problem, completion) -> float:
    return self.verifier.verify(problem, completion)

  def observe(self, problems, rewards) -> dict:
    """Curriculum update from scored rows (``problems[i]`` got ``rewards[i]``); metrics."""
    out = {}
    if self.curriculum is not None:
      self.curriculum = curriculum_lib.update(
        self.curriculum, [(p.env, p.level, float(r)) for p, r in zip(problems, rewards)]
      )
      out.update(curriculum_lib.metrics(self.curriculum))
    if self.dataset is not None:
      out["data/epoch"] = self.epoch
    return out

  def state_dict(self) -> dict:
    return {"consumed": self.consumed, "curriculum": self.curriculum}

  def load_state_dict(self, state: dict) -> None:
    self.consumed = int(state.get("consumed", 0))
    if self.curriculum is not None:
      if state.get("curriculum") is None:
        raise ConfigError(
          "the RL checkpoint holds no curriculum state; it was written without "
          "config.rl.curriculum (resume with the same config or a fresh workdir)"
        )
      self.curriculum = curriculum_lib.check_state(state["curriculum"])


def row_problems(problems, group) -> list:
  """The problem of every row (``group[r]`` indexes ``problems``)."""
  return [problems[int(g)] for g in group]


def round_key(key: jax.Array, r: int) -> jax.Array:
  """The key of draw round ``r`` of a step (round 0 is the step's own key)."""
  return key if r == 0 else jax.random.fold_in(key, streams.tag("rounds", r))
