"""Reward shaping: terms added to the verifier's rewards before the advantage, and rows kept out
of the loss.

Shapes: ``B`` sequences. A shaping term maps ``[B]`` rewards to ``(rewards [B], keep [B],
metrics)``: the shaped rewards, and a float row weight that multiplies the loss mask (1 keeps
the row; 0 drops it from the update, not from the group statistics). :data:`SHAPINGS` maps a
config name (``config.rl.reward_shaping``, name -> kwargs) to a term; every term reads the
rows' ``ShapingInputs``.
"""

from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp

from posttrain_jax import registry


class ShapingInputs(NamedTuple):
  """What a shaping term may read.

  Attributes:
    lengths: [B] int32 completion lengths (EOS included).
    truncated: [B] bool, the completion hit the budget without EOS.
    max_length: the generation budget ``L_max`` (``max_new_tokens``), a Python int.
    logprobs: [B, T] float32 behaviour log-probs of the completion tokens (the sampler's).
    mask: [B, T] float completion mask (1 on the completion's tokens).
    teacher_logprobs: [B, T] float32 the configured teacher's log-probs of the same tokens
      (``config.rl.teacher``), given only to a term tagged ``reads("teacher_logprobs")``.
  """

  lengths: jax.Array
  truncated: jax.Array
  max_length: int
  logprobs: jax.Array | None = None
  mask: jax.Array | None = None
  teacher_logprobs: jax.Array | None = None


def mean_token_logprob(logprobs: jax.Array, mask: jax.Array) -> jax.Array:
  """``(1/|y|) sum_t log p(y_t | x, y_<t)`` per row: [B, T] log-probs, [B, T] mask -> [B]
  (0 for a row without tokens)."""
  mask = mask.astype(jnp.float32)
  return jnp.sum(logprobs * mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0)


def overlong_penalty(
  lengths: jax.Array, *, max_length: int, buffer: int, factor: float = 1.0
) -> jax.Array:
  """DAPO's soft overlong punishment (Yu et al. 2025, "DAPO", eq. 13), times ``factor``:

      R(y) = 0                                 |y| <= L_max - L_cache
             ((L_max - L_cache) - |y|) / L_cache   L_max - L_cache < |y| <= L_max
             -1                                L_max < |y|

  with ``L_cache = buffer``: a linear ramp from 0 to -1 over the last ``buffer`` tokens of the
  budget. Args: lengths [B] int; max_length L_max; buffer L_cache (0: no penalty).
  Returns [B] float32 (<= 0).
  """
  chex.assert_rank(lengths, 1)
  if not 0 <= buffer <= max_length:
    raise ValueError(f"the overlong buffer must lie in [0, max_length={max_length}], got {buffer}")
  if buffer == 0:
    return jnp.zeros(lengths.shape, jnp.float32)
  n = lengths.astype(jnp.float32)
  start = float(max_length - buffer)
  ramp = (start - n) / float(buffer)
  penalty = jnp.where(n <= start, 0.0, jnp.where(n <= max_length, ramp, -1.0))
  return factor * penalty


def overlong(
  rewards: jax.Array,
  inputs: ShapingInputs,
  *,
  buffer: int = 0,
  factor: float = 1.0,
  mask_truncated: bool = False,
):
  """DAPO's overlong reward shaping (section 3.4): the soft length penalty of
  :func:`overlong_penalty` added to the rewards, and with ``mask_truncated`` its overlong
  filtering: truncated completions are kept out of the loss (``keep = 0``).

  Args:
    rewards: [B] float32. inputs: ShapingInputs. buffer: L_cache (0: no penalty).
    factor: the penalty's weight. mask_truncated: drop truncated rows from the loss.

  Returns:
    (rewards + penalty [B], keep [B] float32, metrics).
  """
  chex.assert_rank(rewards, 1)
  penalty = overlong_penalty(
    inputs.lengths, max_length=inputs.max_length, buffer=buffer, factor=factor
  )
  truncated = inputs.truncated.astype(jnp.float32)
  keep = 1.0 - truncated if mask_truncated else jnp.ones_like(truncated)
  metrics = {
    "shaping/overlong_penalty": jnp.mean(penalty),
    "shaping/penalised": jnp.mean((penalty < 0).astype(jnp.float32)),
    "shaping/dropped_truncated": jnp.sum(1.0 - keep),
  }
  return rewards + penalty, keep, metrics


def length_bonus(
  rewards: jax.Array, inputs: ShapingInputs, *, coef: float = 0.1, only_correct: bool = False
):
  """A reward slightly correlated with length: the "length exploit" of CGTR's toy task
  (arXiv 2606.03532; research/methods_A.md section 9 (c)), a task where a policy can buy
  reward by growing its completions, so a teacher refreshed too eagerly follows the drift:

      r'(y) = r(y) + coef * |y| / L_max          (with only_correct: only where r(y) > 0)

  ``|y|`` the completion length (EOS included), ``L_max`` = ``max_new_tokens``. By default
  every row gets the bonus, so even a group with no correct answer pushes toward longer text
  (the exploit is always available); ``only_correct`` restricts it to rows whose incoming
  reward is positive (the verifiers give 1.0 to a correct answer and 0.0 otherwise; after an
  ``overlong`` term a correct answer penalised to <= 0 counts as not correct).

  Args:
    rewards: [B] float32. inputs: ShapingInputs (lengths, max_length). coef: the bonus for a
    completion of the full budget (0.1). only_correct: bonus on positive-reward rows only.

  Returns:
    (rewards + bonus [B], keep [B] float32 (all ones), metrics).
  """
  chex.assert_rank(rewards, 1)
  chex.assert_equal_shape((rewards, inputs.lengths))
  if inputs.max_length < 1:
    raise ValueError(f"length_bonus needs max_length >= 1, got {inputs.max_length}")
  bonus = coef * inputs.lengths.astype(jnp.float32) / float(inputs.max_length)
  if only_correct:
    bonus = jnp.where(rewards > 0, bonus, 0.0)
  metrics = {"shaping/length_bonus": jnp.mean(bonus)}
  return rewards + bonus, jnp.ones(rewards.shape, jnp.float32), metrics


def self_certainty(rewards: jax.Array, inputs: ShapingInputs, *, coef: float = 1.0):
  """The generator's confidence in its own completion as a reward (the label-free baseline of
  CME's toy, methods_B.md section 14 (c): "self-certainty (generator's own mean log-prob)"):

      r'(y) = r(y) + coef * (1/|y|) sum_t log pi(y_t | x, y_<t)

  with the behaviour log-probs the sampler recorded (at its sampling temperature). Set the
  verifier's term weight to 0 (``config.reward.terms = {"correct": {"weight": 0}}``) for the
  pure self-reward.

  Args:
    rewards: [B] float32. inputs: ShapingInputs (logprobs, mask). coef: the weight.

  Returns:
    (rewards + coef * mean log-prob [B], keep [B] float32 (all ones), metrics).
  """
  chex.assert_rank(rewards, 1)
  if inputs.logprobs is None or inputs.mask is None:
    raise ValueError("self_certainty needs the rollout's log-probs and completion mask")
  mean_lp = mean_token_logprob(inputs.logprobs, inputs.mask)
  metrics = {"shaping/self_certainty": jnp.mean(mean_lp)}
  return rewards + coef * mean_lp, jnp.ones(rewards.shape, jnp.float32), metrics


@registry.reads("teacher_logprobs")
def cme(rewards: jax.Array, inputs: ShapingInputs, *, coef: float = 1.0):
  """CME, the cross-model entropy reward (arXiv 2605.29009; methods_B.md section 14): the mean
  log-likelihood of the generator's completion under a separate frozen verifier LM,

      r'(y) = r(y) + coef * (1/|y|) sum_t log p_V(y_t | x, y_<t)      (<= r(y) for coef > 0)

  The verifier is the run's teacher (``config.rl.teacher``: e.g. source 'stage', a model
  pretrained on cleaner text, or 'path'; same tokenizer; its ``temperature`` 1 for the plain
  likelihood) scoring the generator's own tokens, no gradient. Label-free: set the env
  verifier's weight to 0 (``config.reward.terms = {"correct": {"weight": 0}}``).

  Args:
    rewards: [B] float32. inputs: ShapingInputs (teacher_logprobs, mask). coef: the weight.

  Returns:
    (rewards + coef * mean verifier log-prob [B], keep [B] float32 (all ones), metrics).
  """
  chex.assert_rank(rewards, 1)
  if inputs.teacher_logprobs is None or inputs.mask is None:
    raise ValueError(
      "cme needs the verifier's (config.rl.teacher's) log-probs of the "
      "completion tokens and the completion mask"
    )
  score = mean_token_logprob(inputs.teacher_logprobs, inputs.mask)
  metrics = {"shaping/cme": jnp.mean(score)}
  return rewards + coef * score, jnp.ones(rewards.shape, jnp.float32), metrics


SHAPINGS: dict[str, Callable] = {
  "overlong": overlong,
  "length_bonus": length_bonus,
  "self_certainty": self_certainty,
  "cme": cme,
}
