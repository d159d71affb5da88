"""Bradley-Terry reward models: the score, the loss, a trained model loaded, and the batched
reward term ``reward_model``.

A reward model (RM) is the decoder trunk with a scalar head (``ModelConfig.output_dim = 1``),
trained by the ``reward_model`` stage (:mod:`posttrain_jax.train.reward_model`).

Layout, the same in training and scoring (:func:`encode`, :func:`pad`): the prompt's tokens,
then the completion's, then EOS, right-padded with the pad id. The score is the head's output
at the last valid position, the EOS at index ``length - 1``, read at that explicit index (never
by searching for the first pad token, which breaks when pad == EOS or the text holds one). A
causal model's output there does not see the padding after it, so a score does not depend on
the padding amount or on the other rows of its batch. A sequence longer than ``max_len``
keeps its first ``max_len - 1`` tokens, then the EOS.

The stage leaves, in ``WORKDIR/reward_model/``: ``final/`` (the parameters),
``tokenizer/`` (the RM's tokenizer) and ``reward_model.json`` (the model config, ``max_len`` and
the held-out reward mean / std used by ``normalize``). :func:`load` reads them back.
"""

import dataclasses
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posttrain_jax import io as ptio
from posttrain_jax import models, rollout
from posttrain_jax.registry import ConfigError
from posttrain_jax.rewards.catalogue import REWARDS, RunInfo, batched

STAGE = "reward_model"
META_FILE = "reward_model.json"
TOKENIZER_DIR = "tokenizer"
MIN_ROWS = 8  # the smallest batch a score call compiles for (rows are bucketed)
MAX_ROWS = 256  # rows per device call when scoring


# -- the layout -------------------------------------------------------------------------------
def encode(tokenizer, prompts, completions, max_len: int) -> list[list[int]]:
  """Token ids of ``prompt + completion + EOS`` per pair, at most ``max_len`` of them (a longer
  sequence keeps its first ``max_len - 1`` tokens and the EOS)."""
  if max_len < 2:
    raise ValueError(f"max_len must be >= 2 (a token and the EOS), got {max_len}")
  texts = [p + c for p, c in zip(prompts, completions)]
  if not texts:
    return []
  ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
  eos = tokenizer.eos_token_id
  return [list(row[: max_len - 1]) + [eos] for row in ids]


def pad(ids: list[list[int]], length: int, pad_id: int, rows: int | None = None):
  """``(tokens [R, length] int32, lengths [R] int32)``: ``ids`` right-padded with ``pad_id``;
  ``rows`` (>= len(ids)) adds rows of one pad token (length 1) to fill a bucketed batch."""
  rows = len(ids) if rows is None else rows
  tokens = np.full((rows, length), pad_id, np.int32)
  lengths = np.ones((rows,), np.int32)
  for i, row in enumerate(ids):
    if len(row) > length:
      raise ValueError(f"row {i} has {len(row)} tokens, over the padded length {length}")
    tokens[i, : len(row)] = row
    lengths[i] = len(row)
  return tokens, lengths


def read_scores(head: jax.Array, lengths: jax.Array) -> jax.Array:
  """``[B]`` float32: the head's output ``[B, T]`` at each row's last valid index
  ``lengths - 1``."""
  index = jnp.clip(lengths.astype(jnp.int32) - 1, 0, head.shape[1] - 1)
  return jnp.take_along_axis(head, index[:, None], axis=1)[:, 0].astype(jnp.float32)


def scores(graphdef, params, tokens: jax.Array, lengths: jax.Array) -> jax.Array:
  """``[B]`` rewards of right-padded ``tokens`` [B, T] with ``lengths`` [B] (traceable)."""
  model = nnx.merge(graphdef, params)
  return read_scores(model(tokens).logits[..., 0], lengths)


def bradley_terry_loss(
  chosen: jax.Array, rejected: jax.Array, margin: jax.Array | None = None, center_coef: float = 0.0
) -> tuple[jax.Array, dict]:
  """``mean(-log sigmoid(r_c - r_r - margin)) + center_coef * mean((r_c + r_r)^2)`` over the
  pairs (TRL's RewardTrainer loss; the centring term is Eisenstein et al. 2023, eq. 2), and its
  metrics: the two parts, the pairwise accuracy (r_c > r_r) and the mean margin r_c - r_r."""
  diff = chosen - rejected
  target = diff if margin is None else diff - margin
  bt = jnp.mean(-jax.nn.log_sigmoid(target))
  center = jnp.mean(jnp.square(chosen + rejected))
  loss = bt + center_coef * center
  return loss, {
    "loss/bt": bt,
    "loss/center": center,
    "accuracy": jnp.mean((diff > 0).astype(jnp.float32)),
    "margin": jnp.mean(diff),
    "reward/mean": 0.5 * jnp.mean(chosen + rejected),
  }


def scalar_config(config: models.ModelConfig) -> models.ModelConfig:
  """``config`` with a scalar head (``output_dim = 1``, never tied to the embedding)."""
  return dataclasses.replace(config, output_dim=1)


# -- a trained reward model -------------------------------------------------------------------
def make_score_fn(graphdef):
  """Jitted ``(params, tokens [B, T], lengths [B]) -> [B]`` of :func:`scores`."""
  return jax.jit(lambda params, tokens, lengths: scores(graphdef, params, tokens, lengths))


def score_ids(
  score_fn, params, ids: list[list[int]], *, pad_id: int, max_len: int, batch_rows: int = MAX_ROWS
) -> np.ndarray:
  """``[N]`` float32 raw rewards of encoded sequences (:func:`encode`), scored in chunks of at
  most ``batch_rows`` rows, each padded to a power-of-two row count and length (a run compiles
  a handful of shapes)."""
  out = np.zeros((len(ids),), np.float32)
  for lo in range(0, len(ids), batch_rows):
    chunk = ids[lo : lo + batch_rows]
    length = min(rollout.bucket_length(max(len(r) for r in chunk)), max_len)
    rows = rollout.bucket_length(len(chunk), MIN_ROWS)
    tokens, lengths = pad(chunk, length, pad_id, rows)
    out[lo : lo + len(chunk)] = np.asarray(score_fn(params, tokens, lengths))[: len(chunk)]
  return out


def score_texts(
  score_fn, params, tokenizer, prompts, completions, *, max_len: int, batch_rows: int = MAX_ROWS
) -> np.ndarray:
  """``[N]`` float32 raw rewards of ``prompt + completion`` texts (:func:`score_ids`)."""
  ids = encode(tokenizer, list(prompts), list(completions), max_len)
  return score_ids(
    score_fn, params, ids, pad_id=tokenizer.pad_token_id, max_len=max_len, batch_rows=batch_rows
  )


@dataclasses.dataclass
class RewardModel:
  """A loaded reward model.

  Attributes:
    graphdef, params: the scalar-head decoder.
    tokenizer: the RM's own tokenizer (texts are re-tokenised with it).
    max_len: the longest sequence it scores (longer ones are cut, see :func:`encode`).
    mean, std: its rewards' mean and standard deviation on the held-out pairs of its stage.
    path: the ``final`` folder it was loaded from.
  """

  graphdef: Any
  params: Any
  tokenizer: Any
  max_len: int
  mean: float = 0.0
  std: float = 1.0
  path: str = ""
  score_fn: Any = None

  def __post_init__(self):
    if self.score_fn is None:
      self.score_fn = make_score_fn(self.graphdef)

  def score(self, prompts, completions, *, normalize: bool = False) -> np.ndarray:
    """``[N]`` float32 rewards of ``prompt + completion`` texts; with ``normalize``,
    ``(r - mean) / std`` with the stored held-out statistics."""
    raw = score_texts(
      self.score_fn, self.params, self.tokenizer, prompts, completions, max_len=self.max_len
    )
    if normalize:
      raw = (raw - self.mean) / max(self.std, 1e-8)
    return raw.astype(np.float32)


def save_meta(
  stage_dir: str, model_config: models.ModelConfig, tokenizer, *, max_len: int, stats: dict
) -> None:
  """Writes what :func:`load` needs beside ``final/``: the tokenizer and reward_model.json
  (the model config, ``max_len`` and ``stats``: at least ``mean`` and ``std``)."""
  models.save_tokenizer(tokenizer, os.path.join(stage_dir, TOKENIZER_DIR))
  meta = {
    "model": dataclasses.asdict(model_config),
    "max_len": int(max_len),
    **{k: float(v) for k, v in stats.items()},
  }
  tmp = os.path.join(stage_dir, META_FILE + ".tmp")
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(meta, f, indent=2, sort_keys=True)
  os.replace(tmp, os.path.join(stage_dir, META_FILE))


def final_path(path: str, workdir: str = "") -> str:
  """The ``final`` folder ``path`` names: a ``reward_model/final`` folder, a stage folder
  holding one, or a run's workdir; empty ``path``: the run in ``workdir``. ConfigError when
  there is none."""
  given = path
  path = path or workdir
  if not path:
    raise ConfigError(
      "the reward term 'reward_model' needs kwargs path=<a run's "
      "reward_model/final folder> when the run has no workdir"
    )
  path = os.path.abspath(os.path.expanduser(path))
  for candidate in (path, os.path.join(path, "final"), os.path.join(path, STAGE, "final")):
    if (
      os.path.isdir(candidate)
      and os.path.basename(candidate) == "final"
      and os.path.isfile(os.path.join(os.path.dirname(candidate), META_FILE))
    ):
      return candidate
  where = f"path={given!r}" if given else f"this run's workdir {workdir!r}"
  raise ConfigError(
    f"the reward term 'reward_model' found no trained reward model at {where} "
    f"(no reward_model/final with {META_FILE} beside it); run the "
    "'reward_model' stage first (config.stages), or set kwargs path to a run "
    "that did"
  )


def load(path: str, workdir: str = "") -> RewardModel:
  """The reward model of a ``reward_model`` stage (see :func:`final_path` for ``path``),
  on this process's first device."""
  final = final_path(path, workdir)
  stage_dir = os.path.dirname(final)
  with open(os.path.join(stage_dir, META_FILE), encoding="utf-8") as f:
    meta = json.load(f)
  config = models.ModelConfig(**meta["model"])
  graphdef, target = nnx.split(
    nnx.eval_shape(lambda: models.Decoder(config, rngs=nnx.Rngs(params=0)))
  )
  state, _ = ptio.checkpoint.restore_single_device(final, target)
  tokenizer = models.load_tokenizer(os.path.join(stage_dir, TOKENIZER_DIR))
  return RewardModel(
    graphdef=graphdef,
    params=state,
    tokenizer=tokenizer,
    max_len=int(meta["max_len"]),
    mean=float(meta.get("mean", 0.0)),
    std=float(meta.get("std", 1.0)),
    path=final,
  )


@batched
def reward_model_term(
  problems, completions, *, run: RunInfo, path: str = "", normalize: bool = True
) -> np.ndarray:
  """The batched reward term ``reward_model``: ``[N]`` scores of ``problem.prompt +
  completion`` by a trained reward model (``path``: see :func:`final_path`; empty: this run's
  own ``reward_model`` stage), normalised with its held-out mean / std unless ``normalize`` is
  False. The model is loaded once per run (kept in ``run.cache``)."""
  key = ("reward_model", final_path(path, run.workdir))
  rm = run.cache.get(key)
  if rm is None:
    rm = run.cache[key] = load(key[1])
  return rm.score([p.prompt for p in problems], list(completions), normalize=normalize)


REWARDS["reward_model"] = reward_model_term
