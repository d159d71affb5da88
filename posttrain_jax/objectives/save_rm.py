"""SAVE: a reward model that improves itself on the policy's own rollouts against a prompt value
anchor (arXiv 2605.30888; research/methods_B.md section 6). The pure, jittable math.

Shapes: ``P`` prompts, ``G`` rollouts each. The RM has two heads on one backbone: a response
reward ``r(x, y_i)`` ([P, G]) and a prompt value ``V(x)`` ([P]). ``valid`` ([P, G], 1 for a
real row) masks padding rows out of every statistic. Each loss is one function, marked as
section 6 marks it: *[derived]* (the form follows the paper's description, its exact equation
is not published) or *[ours]* (our choice where the paper gives none):

- :func:`rm_advantage`: ``A_i = r(x, y_i) - V(x)`` [derived].
- :func:`value_loss`: ``(V(x) - sg(mean_i r(x, y_i)))^2`` [derived].
- :func:`filter_delta`: ``delta = k * std(A)`` over the batch (k = 0.5) [ours].
- :func:`filter_pairs`: (pos, neg) pairs within a prompt, ``A+ > delta`` and ``A- < -delta``
  [derived]; :func:`ordered_pairs`: every pair ordered by A, no filter (the ablation) [ours].
- :func:`pair_bt_loss`: ``-mean log sigma(r+ - r-)`` over the pairs [derived].
- :func:`anchor_loss`: ``-log sigma(r+ - V) - log sigma(V - r-)`` per selected row [derived].
- :func:`save_loss`: the value loss plus the contrastive loss of one SAVE update.
- :func:`pairwise_accuracy`: the RM's on-policy pairwise accuracy against a true reward.
"""

import jax
import jax.numpy as jnp

OBJECTIVES = ("pairs", "anchor")


def _valid(rewards: jax.Array, valid: jax.Array | None) -> jax.Array:
  return jnp.ones(rewards.shape, jnp.float32) if valid is None else valid.astype(jnp.float32)


def rm_advantage(rewards: jax.Array, values: jax.Array) -> jax.Array:
  """[derived] The RM advantage ``A_i = r(x, y_i) - V(x)``: [P, G] rewards, [P] values ->
  [P, G]."""
  return rewards - values[:, None]


def value_loss(values: jax.Array, rewards: jax.Array, valid: jax.Array | None = None) -> jax.Array:
  """[derived] ``mean_x (V(x) - sg(mean_i r(x, y_i)))^2``: the value tracks the policy's mean
  RM reward per prompt (the target is stop-gradient, so only V learns from it). Prompts without
  a valid row are left out. [P] values, [P, G] rewards -> scalar."""
  w = _valid(rewards, valid)
  count = jnp.sum(w, axis=1)
  target = jax.lax.stop_gradient(jnp.sum(rewards * w, axis=1) / jnp.maximum(count, 1.0))
  has = (count > 0).astype(jnp.float32)
  return jnp.sum(has * jnp.square(values - target)) / jnp.maximum(jnp.sum(has), 1.0)


def filter_delta(adv: jax.Array, valid: jax.Array | None = None, k: float = 0.5) -> jax.Array:
  """[ours] The filter's threshold ``delta = k * std(A)``, the standard deviation of the
  valid rows' advantages over the whole batch (stop-gradient). Scalar."""
  w = _valid(adv, valid)
  n = jnp.maximum(jnp.sum(w), 1.0)
  mean = jnp.sum(adv * w) / n
  std = jnp.sqrt(jnp.sum(w * jnp.square(adv - mean)) / n)
  return jax.lax.stop_gradient(k * std)


def filter_masks(
  adv: jax.Array, delta, valid: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
  """[derived] ``(positives, negatives)`` [P, G] bool: ``A > delta`` and ``A < -delta`` among
  the valid rows; the ambiguous rows ``|A| <= delta`` are in neither."""
  w = _valid(adv, valid) > 0
  return (adv > delta) & w, (adv < -delta) & w


def filter_pairs(adv: jax.Array, delta, valid: jax.Array | None = None) -> jax.Array:
  """[derived] [P, G, G] bool, ``[p, i, j]`` True when row i is a positive and row j a negative
  of prompt p (:func:`filter_masks`): the contrastive pairs of the filtered update."""
  pos, neg = filter_masks(adv, delta, valid)
  return pos[:, :, None] & neg[:, None, :]


def ordered_pairs(adv: jax.Array, valid: jax.Array | None = None) -> jax.Array:
  """[ours] SAVE without the filter: [P, G, G] bool, every pair of valid rows of a prompt with
  ``A_i > A_j`` (no threshold, no ambiguous rows dropped)."""
  w = _valid(adv, valid) > 0
  return (adv[:, :, None] > adv[:, None, :]) & w[:, :, None] & w[:, None, :]


def pair_bt_loss(rewards: jax.Array, pairs: jax.Array) -> tuple[jax.Array, jax.Array]:
  """[derived] Within-prompt Bradley-Terry over the pairs: ``-mean log sigma(r_i - r_j)`` over
  the True entries of ``pairs`` [P, G, G] (row i preferred to row j). Returns ``(loss, number
  of pairs)``; no pairs: loss 0 with a zero gradient (never NaN)."""
  diff = rewards[:, :, None] - rewards[:, None, :]
  m = pairs.astype(jnp.float32)
  n = jnp.sum(m)
  loss = jnp.sum(m * -jax.nn.log_sigmoid(diff)) / jnp.maximum(n, 1.0)
  return loss, n


def anchor_loss(
  rewards: jax.Array, values: jax.Array, pos: jax.Array, neg: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """[derived] The anchor-based alternative: ``-log sigma(r+ - V(x))`` for each positive and
  ``-log sigma(V(x) - r-)`` for each negative, averaged over the selected rows (gradient to
  both the reward and the value). Returns ``(loss, number of selected rows)``; none: 0."""
  v = values[:, None]
  p, q = pos.astype(jnp.float32), neg.astype(jnp.float32)
  per = p * -jax.nn.log_sigmoid(rewards - v) + q * -jax.nn.log_sigmoid(v - rewards)
  n = jnp.sum(p) + jnp.sum(q)
  return jnp.sum(per) / jnp.maximum(n, 1.0), n


def save_loss(
  rewards: jax.Array,
  values: jax.Array,
  valid: jax.Array | None = None,
  *,
  use_filter: bool = True,
  k: float = 0.5,
  delta: float = 0.0,
  objective: str = "pairs",
  value_coef: float = 1.0,
) -> tuple[jax.Array, dict]:
  """One SAVE update's loss on a [P, G] group of on-policy RM rewards and [P] values:
  ``contrastive + value_coef * value_loss``.

  Args:
    rewards: [P, G] ``r(x, y_i)``. values: [P] ``V(x)``. valid: [P, G] row mask (None: all).
    use_filter: drop ambiguous rows with the threshold (False: :func:`ordered_pairs`).
    k: ``delta = k * std(A)`` when ``delta`` is 0 [ours]. delta: a fixed threshold (> 0).
    objective: 'pairs' (:func:`pair_bt_loss`) or 'anchor' (:func:`anchor_loss`).
    value_coef: the value loss's weight.

  Returns:
    ``(loss, metrics)``: ``save/contrastive``, ``save/value_loss``, ``save/delta``,
    ``save/pairs`` (or selected rows for 'anchor'), ``save/kept`` (fraction of valid rows that
    are positive or negative), ``save/adv_std``.
  """
  if objective not in OBJECTIVES:
    raise ValueError(f"SAVE objective must be one of {OBJECTIVES}, got {objective!r}")
  if objective == "anchor" and not use_filter:
    raise ValueError(
      "the anchor objective needs the filter (positives and negatives); use "
      "objective='pairs' for SAVE without the filter"
    )
  w = _valid(rewards, valid)
  adv = rm_advantage(rewards, values)
  thr = jnp.asarray(delta, jnp.float32) if delta > 0 else filter_delta(adv, w, k)
  pos, neg = filter_masks(adv, thr, w)
  if objective == "anchor":
    contrastive, count = anchor_loss(rewards, values, pos, neg)
  else:
    pairs = filter_pairs(adv, thr, w) if use_filter else ordered_pairs(adv, w)
    contrastive, count = pair_bt_loss(rewards, pairs)
  v_loss = value_loss(values, rewards, w)
  kept = jnp.sum((pos | neg).astype(jnp.float32)) / jnp.maximum(jnp.sum(w), 1.0)
  metrics = {
    "save/contrastive": contrastive,
    "save/value_loss": v_loss,
    "save/delta": thr,
    "save/pairs": count,
    "save/kept": kept if use_filter else jnp.float32(1.0),
    "save/adv_std": filter_delta(adv, w, 1.0),
  }
  return contrastive + value_coef * v_loss, metrics


def pairwise_accuracy(
  scores: jax.Array, truth: jax.Array, valid: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
  """The RM's pairwise accuracy against a true reward on [P, G] on-policy groups: over the
  pairs of valid rows of a prompt whose true rewards differ, the fraction the scores order the
  same way (a score tie counts half). Returns ``(accuracy, number of pairs)``; no pair: 0.5."""
  w = _valid(scores, valid) > 0
  both = w[:, :, None] & w[:, None, :]
  better = (truth[:, :, None] > truth[:, None, :]) & both
  ds = scores[:, :, None] - scores[:, None, :]
  right = jnp.where(ds > 0, 1.0, jnp.where(ds == 0, 0.5, 0.0))
  n = jnp.sum(better.astype(jnp.float32))
  acc = jnp.sum(jnp.where(better, right, 0.0)) / jnp.maximum(n, 1.0)
  return jnp.where(n > 0, acc, 0.5), n
