"""On-policy distillation token advantages: OPD and GNDPO.

Shapes: ``B`` sequences, ``T`` completion tokens. Both read the student (sampler) and teacher
log-probs of the sampled tokens; :data:`ADVANTAGES` maps a config name to an adapter over
:class:`~posttrain_jax.objectives.advantage_inputs.AdvantageInputs` (it reads
``teacher_logprobs``)::

    fn(inputs: AdvantageInputs, *, num_groups: int, **hparams) -> ([B, T] advantages, metrics)
"""

from typing import Callable

import jax
import jax.numpy as jnp

from posttrain_jax.objectives.advantage_inputs import (
  _check_tokens,
  _require,
  _row_metrics,
  _token_mask,
)
from posttrain_jax.objectives.reductions import masked_mean, masked_var, safe_divide
from posttrain_jax.registry import reads

sg = jax.lax.stop_gradient


def _distill_scores(logprobs, teacher_logprobs, mask, clip):
  _check_tokens(logprobs, teacher_logprobs, mask)
  s = jnp.where(mask > 0, sg(teacher_logprobs) - sg(logprobs), 0.0)
  clipped = jnp.zeros_like(s) if clip is None else (jnp.abs(s) > clip).astype(jnp.float32)
  if clip is not None:
    s = jnp.clip(s, -clip, clip)
  metrics = {
    "distill/score_mean": masked_mean(s, mask),
    "distill/score_std": jnp.sqrt(masked_var(s, mask, ddof=1)),
    "distill/clip_frac": masked_mean(clipped, mask),
  }
  return s, metrics


def opd(
  logprobs: jax.Array, teacher_logprobs: jax.Array, mask: jax.Array, *, clip: float | None = 5.0
):
  """On-policy distillation token advantage (the OPD baseline of GNDPO, arXiv 2606.09091; from
  code, research/methods_A.md §2): the negative per-token reverse-KL sample, clipped.

      s_t = clip(log π_T(y_t) - log π_S(y_t), -c, c),    A_t = s_t · m_t

  Args:
    logprobs: [B, T] float32 student (sampler) log-probs of the sampled tokens.
    teacher_logprobs: [B, T] float32 teacher log-probs of the same tokens.
    mask: [B, T] float32 completion mask.
    clip: c (None: no clipping).

  Returns:
    ([B, T] advantages, stop-gradient, 0 on masked tokens; metrics).
  """
  s, metrics = _distill_scores(logprobs, teacher_logprobs, mask, clip)
  adv = s * mask
  metrics.update(_row_metrics(adv, mask))
  return adv, metrics


def gndpo(
  logprobs: jax.Array,
  teacher_logprobs: jax.Array,
  mask: jax.Array,
  *,
  clip: float | None = 5.0,
  eps: float = 1e-8,
):
  """GNDPO token advantage (Globally Normalized Distillation Policy Optimization, arXiv
  2606.09091; from the released verl code, research/methods_A.md §2).

      s_t = clip(log π_T(y_t) - log π_S(y_t), -c, c)
      A_t = (s_t - μ) / sqrt(σ² + eps) · m_t

  μ and the Bessel-corrected σ² run over ALL valid tokens of the batch (not per group or
  sequence), so A has masked mean 0 and unbiased masked variance ≈ 1.

  Args:
    logprobs: [B, T] float32 student log-probs; teacher_logprobs: [B, T] float32;
    mask: [B, T] float32 completion mask.
    clip: c (None: no clipping). eps: added to σ².

  Returns:
    ([B, T] advantages, stop-gradient, 0 on masked tokens; metrics).
  """
  s, metrics = _distill_scores(logprobs, teacher_logprobs, mask, clip)
  mu = masked_mean(s, mask)
  var = masked_var(s, mask, ddof=1)
  adv = jnp.where(mask > 0, safe_divide(s - mu, jnp.sqrt(var + eps)), 0.0)
  metrics.update(_row_metrics(adv, mask))
  return adv, metrics


# ---------------------------------------------------------------------------------------------
# Registry adapters.


def _distill_entry(fn, name):
  @reads("teacher_logprobs")
  def entry(inputs, *, num_groups, **hparams):
    del num_groups
    teacher = _require(inputs, "teacher_logprobs", name, "[B, T] teacher log-probs")
    student = _require(inputs, "logprobs", name, "[B, T] student log-probs")
    return fn(student, teacher, _token_mask(inputs, name), **hparams)

  return entry


# Config name -> adapter over AdvantageInputs.
ADVANTAGES: dict[str, Callable] = {
  "opd": _distill_entry(opd, "opd"),
  "gndpo": _distill_entry(gndpo, "gndpo"),
}
