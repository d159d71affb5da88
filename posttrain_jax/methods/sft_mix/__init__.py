"""RL+SFT parallel averaging (methods_A.md section 8, "RL excursions"): every RL update also
trains on supervised rows, and its gradient is ``g = beta grad L_RL + (1 - beta) grad L_CE``.

The pool is a fixed set of gold (prompt, completion) examples, the env's noise-free transcripts
or a JSONL file's lines (``train/sft.py``'s readers, chat template included), tokenised once
(``build``). Each step's fresh rows get as many supervised rows as they have RL rows, drawn
without replacement from the pool with the step's key (the ``sft_tokens`` and ``sft_mask``
producers); the loss term ``sft_mix`` (train/loss_terms.py) mixes the two losses with
``rl.sft_mix.beta`` (``loss_settings``). A replay scheduler's stored rows have no step key, so
the method runs without one (``check``).
"""

import jax
import jax.numpy as jnp
import numpy as np

from posttrain_jax import streams
from posttrain_jax.methods.sft_mix.fields import SFT_MIX
from posttrain_jax.registry import ConfigError
from posttrain_jax.train import hooks, pretrain, sft
from posttrain_jax.train import scheduler as scheduler_lib


def active(config) -> bool:
  return bool(config.rl.sft_mix.enabled)


def check(config) -> None:
  section = config.rl.sft_mix
  if section.beta >= 1.0:
    raise ConfigError(
      f"config.rl.sft_mix.beta={section.beta} leaves no weight on the supervised rows; "
      "use a beta in [0, 1) or set config.rl.sft_mix.enabled=False"
    )
  if scheduler_lib.name_of(config.rl) in scheduler_lib.REPLAY:
    raise ConfigError(
      f"config.rl.sft_mix draws its supervised rows with each step's key, which replayed rows "
      f"(scheduler {scheduler_lib.name_of(config.rl)!r}) do not have; use a scheduler "
      "without replay"
    )


class Pool:
  """The supervised pool tokenised once: ``tokens`` and ``mask`` [N, L] (completion + EOS)."""

  def __init__(self, ctx):
    cfg = ctx.config.rl.sft_mix
    pairs = sft.examples(ctx, cfg)
    where = "the env's gold solutions" if cfg.source == sft.ENV else cfg.source
    sft.check_vocabulary(ctx.tokenizer, pairs, where)
    rows = pretrain.tokenize_pairs(ctx.tokenizer, pairs, sft.sequence_length(ctx.tokenizer, pairs))
    self.tokens, self.mask = rows["tokens"], rows["loss_mask"]
    self._last = None  # (key bits, n, indices): the step's draw, shared by both producers

  def draw(self, key, n: int) -> np.ndarray:
    """``n`` pool indices, without replacement while the pool lasts (drawn once per key)."""
    bits = np.asarray(jax.random.key_data(key)).tobytes()
    if self._last is None or self._last[:2] != (bits, n):
      size = len(self.tokens)
      index = np.asarray(jax.random.choice(key, size, (n,), replace=n > size))
      self._last = (bits, n, index)
    return self._last[2]


def build(ctx, init_params):
  del init_params
  return Pool(ctx)


def _rows(src, rows):
  if src.step is None:
    raise ValueError("rl.sft_mix: replayed rows have no step key (check refuses replay)")
  pool = src.methods["sft_mix"]
  key = jax.random.fold_in(src.step.key, streams.tag("sft_mix"))
  return pool, pool.draw(key, rows.valid.shape[0])


def sft_tokens(src, rows, fields):
  del fields
  pool, index = _rows(src, rows)
  return jnp.asarray(pool.tokens[index])


def sft_mask(src, rows, fields):
  del fields
  pool, index = _rows(src, rows)
  return jnp.asarray(pool.mask[index])


METHOD = hooks.Method(
  name="sft_mix",
  section="rl.sft_mix",
  active=active,
  doc="docs/reference.md",
  check=check,
  build=build,
  producers={"sft_tokens": sft_tokens, "sft_mask": sft_mask},
  loss_settings=lambda config: {"sft_beta": float(config.rl.sft_mix.beta)},
  fields={"rl.sft_mix": SFT_MIX},
)

__all__ = ["METHOD", "Pool", "sft_mask", "sft_tokens"]
