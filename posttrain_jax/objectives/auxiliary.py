"""Auxiliary loss terms added to the policy loss: EchoRL's EchoClip SFT term.

Shapes: ``P`` prompts, up to ``G`` rollouts each, ``B`` sequences, ``T`` completion tokens.
Groups are given as in ``advantage_inputs.AdvantageInputs``: ``group [B]`` prompt index per row and
``valid [B]`` (0 for padding rows), so variable group sizes keep one static shape. Every term
in :data:`AUX_LOSSES` returns ``(value, metrics)`` with the value already multiplied by its
coefficient, so the train step adds it as is.
"""

from typing import Callable

import chex
import jax
import jax.numpy as jnp

from posttrain_jax.objectives import reductions
from posttrain_jax.registry import choices, reads


def step_ends_from_tokens(
  tokens: jax.Array, mask: jax.Array, *, delimiter_ids: tuple[int, ...]
) -> jax.Array:
  """``[B, T]`` float: 1 at completion tokens that end a reasoning step (a delimiter such as a
  newline), else 0. ``tokens`` [B, T] int completion ids; ``mask`` [B, T] float."""
  chex.assert_rank([tokens, mask], 2)
  chex.assert_equal_shape([tokens, mask])
  ids = jnp.asarray(delimiter_ids, tokens.dtype)
  is_end = jnp.any(tokens[..., None] == ids, axis=-1)
  return (is_end & (mask > 0)).astype(jnp.float32)


def _step_scores(entropy, mask, step_end, step_score):
  """Per-row step ids ``[B, T]`` and per-step scores ``[B, T]`` (step k in column k; -inf if
  step k has no token). Token t belongs to step = number of step ends strictly before t."""
  rows, cols = mask.shape
  valid = mask > 0
  ends = ((step_end > 0) & valid).astype(jnp.int32)
  step_id = jnp.cumsum(ends, axis=-1) - ends  # a delimiter closes its own step
  seg = (jnp.arange(rows)[:, None] * cols + step_id).reshape(-1)
  count = jax.ops.segment_sum(valid.astype(jnp.float32).reshape(-1), seg, rows * cols)
  if step_score == "mean":
    total = jax.ops.segment_sum(jnp.where(valid, entropy, 0.0).reshape(-1), seg, rows * cols)
    score = total / jnp.maximum(count, 1.0)
  elif step_score == "max":
    score = jax.ops.segment_max(jnp.where(valid, entropy, -jnp.inf).reshape(-1), seg, rows * cols)
  else:
    raise ValueError(f"unknown step_score {step_score!r}; valid: max, mean")
  score = jnp.where(count > 0, score, -jnp.inf).reshape(rows, cols)
  return step_id, score


CLIPS = ("entropy", "first_step", "full")


def echo_clip_mask(
  entropy: jax.Array,
  rewards: jax.Array,
  group: jax.Array,
  valid: jax.Array,
  mask: jax.Array,
  step_end: jax.Array,
  *,
  num_groups: int,
  success_value: float = 1.0,
  step_score: str = "mean",
  clip: str = "entropy",
):
  """EchoRL's EchoClip selection (arXiv 2605.31228; methods_B §5, selection rule derived).

  A group is degenerate when all its valid rewards are equal and successful (std_g r = 0 and
  r ≥ ``success_value``): GRPO gives it zero advantage. In each degenerate group, steps are the
  spans closed by ``step_end`` (the last step may run to the end of the response); the step
  score is H_s = mean_{t∈s} H_t (``step_score="max"``: max) [derived]. The (rollout b*, step s*)
  with the highest H_s in the group is picked (lowest row index on ties), and

      c[b, t] = m[b, t] · 1[b = b*] · 1[t ≤ end(s*)]            (a prefix of rollout b*)

  Non-degenerate groups get c = 0. Entropies and rewards are stop-gradient (selection only).

  Ablations that ignore the entropy (``clip``; the paper compares a random clip and full-response
  SFT on successes): ``"first_step"``, the first step of the group's first valid rollout;
  ``"full"``, that whole rollout. ``"entropy"`` (default) is the rule above.

  Args:
    entropy: [B, T] float32 token entropies H_t of the rollout policy.
    rewards: [B] float32 scalar rewards.
    group: [B] int32 prompt index of each row (0 <= group < num_groups).
    valid: [B] float32, 1 for a real rollout, 0 for a padding row.
    mask: [B, T] float32 completion mask.
    step_end: [B, T] float, 1 at tokens that end a step (see ``step_ends_from_tokens``).
    num_groups: static number of group ids P.
    success_value: reward of a success.
    step_score: "mean" or "max".
    clip: "entropy" (the peak step's prefix), "first_step" or "full" (ablations).

  Returns:
    (clip mask c [B, T] float32, metrics ``echo/degenerate_frac`` (over groups with a valid
    row), ``echo/clip_tokens``, ``echo/peak_entropy``).
  """
  chex.assert_rank([entropy, mask, step_end, rewards, group, valid], [2, 2, 2, 1, 1, 1])
  chex.assert_equal_shape([entropy, mask, step_end])
  chex.assert_equal_shape([rewards, group, valid])
  chex.assert_type([rewards, group, valid], [float, int, float])
  chex.assert_shape(rewards, (mask.shape[0],))
  rows = mask.shape[0]
  entropy = jax.lax.stop_gradient(entropy.astype(jnp.float32))
  rewards = jax.lax.stop_gradient(rewards.astype(jnp.float32))
  ok = valid > 0
  mask = jnp.where(ok[:, None], mask, 0.0)
  step_id, score = _step_scores(entropy, mask, step_end, step_score)
  best_step = jnp.argmax(score, axis=-1)  # [B] first peak step of each row
  best_val = jnp.max(score, axis=-1)  # [B] -inf for rows without tokens
  seg = lambda fn, x: fn(x, group, num_segments=num_groups)
  count = seg(jax.ops.segment_sum, ok.astype(jnp.float32))  # [P]
  r_min = seg(jax.ops.segment_min, jnp.where(ok, rewards, jnp.inf))
  r_max = seg(jax.ops.segment_max, jnp.where(ok, rewards, -jnp.inf))
  degenerate = (count > 0) & (r_min == r_max) & (r_min >= success_value)  # [P]
  if clip not in CLIPS:
    raise ValueError(f"unknown EchoClip rule {clip!r}; known: {list(CLIPS)}")
  group_best = seg(jax.ops.segment_max, best_val)  # [P]
  candidate = degenerate[group] & (best_val > -jnp.inf)
  if clip == "entropy":
    candidate = candidate & (best_val == group_best[group])
  first = seg(jax.ops.segment_min, jnp.where(candidate, jnp.arange(rows), rows))  # [P]
  chosen = candidate & (first[group] == jnp.arange(rows))  # [B]
  last_step = {"entropy": best_step, "first_step": jnp.zeros_like(best_step)}.get(clip)
  within = True if last_step is None else step_id <= last_step[:, None]
  clip = ((mask > 0) & within & chosen[:, None]).astype(jnp.float32)
  n_chosen = jnp.sum(chosen)
  peak = jnp.sum(jnp.where(chosen, best_val, 0.0)) / jnp.maximum(n_chosen, 1)
  n_present = jnp.sum(count > 0)
  return clip, {
    "echo/degenerate_frac": jnp.sum(degenerate) / jnp.maximum(n_present, 1),
    "echo/clip_tokens": jnp.sum(clip),
    "echo/peak_entropy": peak,
  }


@reads("step_end")
@choices(clip=CLIPS, step_score=("mean", "max"))
def echo_clip_loss(
  logprobs: jax.Array,
  entropy: jax.Array,
  rewards: jax.Array,
  group: jax.Array,
  valid: jax.Array,
  mask: jax.Array,
  step_end: jax.Array,
  *,
  num_groups: int,
  coef: float = 0.1,
  success_value: float = 1.0,
  step_score: str = "mean",
  clip: str = "entropy",
):
  """EchoRL auxiliary SFT term on EchoClips (arXiv 2605.31228, ICML 2026; methods_B §5):

      L_echo = -Σ_{b,t} c[b,t] log π(y_{b,t}) / Σ c           (0 when no clip is selected)
      value  = λ · L_echo,         L = L_RLVR + λ L_echo

  with the clip mask c of ``echo_clip_mask``. Gradient flows through ``logprobs`` on clip tokens
  only; λ default 0.1 is ours. Keep degenerate groups in the batch (DAPO's dynamic sampling
  would drop them) so the term sees them, and whole groups in each minibatch.

  Args:
    logprobs: [B, T] float32 current log-probs (differentiated).
    entropy, rewards, group, valid, mask, step_end, num_groups, success_value, step_score: as
      in ``echo_clip_mask``.
    coef: λ.

  Returns:
    (λ L_echo, metrics: ``loss/echo`` (= value), ``echo/nll`` (L_echo), ``echo/num``,
    ``echo/den`` and the selection metrics).
  """
  chex.assert_rank(logprobs, 2)
  chex.assert_equal_shape([logprobs, mask])
  chex.assert_type(logprobs, float)
  clip, metrics = echo_clip_mask(
    entropy,
    rewards,
    group,
    valid,
    mask,
    step_end,
    num_groups=num_groups,
    success_value=success_value,
    step_score=step_score,
    clip=clip,
  )
  num = -reductions.masked_sum(jnp.where(clip > 0, logprobs, 0.0), clip)
  den = jnp.sum(clip)
  nll = num / jnp.maximum(den, 1.0)
  value = coef * nll
  metrics.update({"loss/echo": value, "echo/nll": nll, "echo/num": num, "echo/den": den})
  return value, metrics


AUX_LOSSES: dict[str, Callable] = {"echorl": echo_clip_loss}
