"""Rank-based group advantages: PKPO pass@K / max@K and MaxPO's leave-two-out baseline.

Shapes: ``B`` sequences (``P`` prompt slots × up to ``G`` rollouts), ``K`` of pass@K. The rows
are sorted by (group, reward) once and every estimator uses segmented prefix sums: O(B log B),
no [B, B] arrays; a padding row (``valid = 0``) enters no statistic and gets advantage 0, so
variable group sizes run through one compiled shape. :data:`ADVANTAGES` maps a config name to
an adapter over :class:`~posttrain_jax.objectives.advantage_inputs.AdvantageInputs`::

    fn(inputs: AdvantageInputs, *, num_groups: int, k: int) -> ([B] advantages, metrics)

(The evaluation-time pass@k estimator of sampled correctness is ``pass_at_k_metric``.)
"""

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from posttrain_jax.objectives.advantage_inputs import GroupStats, _check_rows, _group_metrics
from posttrain_jax.objectives.reductions import masked_mean


def _binom_ratio(x: jax.Array, y: jax.Array, k: int) -> jax.Array:
  """C(x, k) / C(y, k) = Π_{t<k} (x - t)/(y - t) for integer-valued float x >= 0, y >= k.

  No factorials, so no overflow; ``k`` is static. Exactly 0 when 0 <= x < k (a factor is 0).
  """
  out = jnp.ones(jnp.broadcast_shapes(jnp.shape(x), jnp.shape(y)), jnp.float32)
  for t in range(k):
    out = out * (x - t) / jnp.maximum(y - t, 1.0)
  return out


class _GroupSort(NamedTuple):
  """Rows sorted by (group, value); padding rows last (segment id ``num_groups``).

  order: [B] permutation (sorted position -> row). seg: [B] segment id per sorted position.
  rank: [B] float 1-based rank of the sorted position inside its group (ties by row index).
  count: [B] float valid size of that group (0 for padding).
  """

  order: jax.Array
  seg: jax.Array
  rank: jax.Array
  count: jax.Array


def _group_sort(values, group, valid, num_groups: int) -> _GroupSort:
  seg_rows = jnp.where(valid > 0, group, num_groups)
  order = jnp.lexsort((values, seg_rows))
  seg = seg_rows[order]
  pos = jnp.arange(values.shape[0])
  start = jax.ops.segment_min(pos, seg, num_segments=num_groups + 1)
  rank = (pos - start[seg] + 1).astype(jnp.float32)
  counts = jax.ops.segment_sum(valid, group, num_segments=num_groups)
  count = jnp.concatenate([counts, jnp.zeros((1,), jnp.float32)])[seg]
  return _GroupSort(order, seg, rank, count)


def _seg_cumsum(x: jax.Array, seg: jax.Array) -> jax.Array:
  """Inclusive prefix sum of ``x`` restarted at every change of the (sorted) segment id."""

  def combine(a, b):
    return b[0], jnp.where(a[0] == b[0], a[1] + b[1], b[1])

  return jax.lax.associative_scan(combine, (seg, x))[1]


def _unsort(x_sorted: jax.Array, order: jax.Array) -> jax.Array:
  return jnp.zeros_like(x_sorted).at[order].set(x_sorted)


# ---------------------------------------------------------------------------------------------
# pass@K and max@K: PKPO (Walder & Karkhanis 2025) and MaxPO's leave-two-out baseline.


def _check_k(k: int, minimum_rows: str):
  if not isinstance(k, int) or k < 1:
    raise ValueError(f"k must be a positive int (K of pass@K), got {k!r}; {minimum_rows}")


def pass_at_k(rewards: jax.Array, group: jax.Array, valid: jax.Array, *, num_groups: int, k: int):
  """PKPO pass@K advantage for binary rewards (Walder & Karkhanis 2025, "Pass@k Policy
  Optimization"), its "loo-1" form as in research/methods_A.md §5, closed form for 0/1 rewards.

  With n valid samples in the group, c of them correct:

      A_i = g_i · (K/n) · C(n - c, K - 1) / C(n - 1, K - 1)

  i.e. a correct sample gets K/n times the probability that K-1 others drawn without replacement
  are all wrong; a wrong sample gets 0. Then E[Σ_i A_i ∇log π(y_i)] = ∇ pass@K with
  pass@K = 1 - (1 - p)^K. This is :func:`max_at_k` specialised to g ∈ {0, 1} (the closed form is
  derived here from the notes' general estimator; the notes mark that estimator as derived).
  Groups with n < K get 0 (metric ``adv/pass_at_k_small_groups``).

  Args:
    rewards: [B] float32 success indicators in {0, 1} (not checked inside jit; the metric
      ``adv/nonbinary_frac`` counts other values).
    group: [B] int32 prompt slot; valid: [B] float32 row mask.
    num_groups: static ``P``.
    k: static K >= 1.

  Returns:
    ([B] advantages >= 0, metrics incl. ``adv/pass_at_k_est``, the unbiased pass@K estimate
    1 - C(n-c, K)/C(n, K) averaged over groups with n >= K).
  """
  _check_rows(rewards, group, valid)
  _check_k(k, "needs n >= K valid rollouts per group")
  seg = lambda x: jax.ops.segment_sum(x, group, num_segments=num_groups)
  n_g, c_g = seg(valid), seg(rewards * valid)
  n, c = n_g[group], c_g[group]
  adv = rewards * (k / jnp.maximum(n, 1.0)) * _binom_ratio(n - c, n - 1.0, k - 1)
  adv = jnp.where((valid > 0) & (n >= k), adv, 0.0)
  metrics = _group_metrics(adv, valid, group, num_groups, k, "pass_at_k")
  ok_g = (n_g >= k).astype(jnp.float32)
  est = 1.0 - _binom_ratio(n_g - c_g, n_g, k)
  metrics["adv/pass_at_k_est"] = jnp.sum(est * ok_g) / jnp.maximum(jnp.sum(ok_g), 1.0)
  binary = (rewards == 0.0) | (rewards == 1.0)
  metrics["adv/nonbinary_frac"] = masked_mean((~binary).astype(jnp.float32), valid)
  return adv, metrics


def _pkpo_sorted(z, gs: _GroupSort, k: int):
  """f(i; S) of every sorted row, S = its group, from the sorted closed form (K >= 2):

  f(r) = (K/n) / C(n-1, K-1) · Σ_{q<r} C(q-1, K-2) (g_(r) - g_(q))
       = (K/n) [g_(r) C(r-1, K-1)/C(n-1, K-1) - Σ_{q<r} g_(q) C(q-1, K-2)/C(n-1, K-1)]
  """
  n, rank = gs.count, gs.rank
  c_q = _binom_ratio(rank - 1.0, n - 1.0, k - 2) * (k - 1) / jnp.maximum(n - k + 1.0, 1.0)
  below = _seg_cumsum(c_q * z, gs.seg) - c_q * z
  return (k / jnp.maximum(n, 1.0)) * (z * _binom_ratio(rank - 1.0, n - 1.0, k - 1) - below)


def max_at_k(rewards: jax.Array, group: jax.Array, valid: jax.Array, *, num_groups: int, k: int):
  """PKPO max@K advantage ("loo-1" form; Walder & Karkhanis 2025; research/methods_A.md §5).

  For the n valid samples S of a group and K <= n:

      A_i = f(i; S) = (K/n) · mean_{L ⊆ S∖{i}, |L| = K-1} (g_i - max_L g)_+

  computed in sorted form (ascending ranks within the group, ties in any fixed order):

      f(r) = (K/n) / C(n-1, K-1) · Σ_{q<r} C(q-1, K-2) (g_(r) - g_(q)).

  For K = 1 the baseline is 0 and A_i = g_i / n (the convention of research/maxpo_check.py; the
  notes' ``(g_i - max_∅)_+`` with max_∅ = 0 agrees for g >= 0). E[Σ_i A_i ∇log π(y_i)] =
  ∇ E[max_{j<=K} g(y_j)] with y_j i.i.d. from π: the baseline max_L g does not depend on y_i.
  The estimator is derived in the notes (from PKPO's summary), not copied from the paper. It is
  >= 0 for K >= 2 (so not centred) and invariant to a shift of g for K >= 2.

  Args:
    rewards: [B] float32 rewards g; group: [B] int32; valid: [B] float32.
    num_groups: static ``P``.
    k: static K >= 1. Groups with n < K get 0 (metric ``adv/max_at_k_small_groups``).

  Returns:
    ([B] advantages, metrics incl. ``adv/max_at_k_est``, the unbiased max@K estimate
    Σ_r g_(r) C(r-1, K-1)/C(n, K) averaged over groups with n >= K).
  """
  _check_rows(rewards, group, valid)
  _check_k(k, "needs n >= K valid rollouts per group")
  gs = _group_sort(rewards, group, valid, num_groups)
  g = rewards[gs.order]
  n = gs.count
  if k == 1:
    f = g / jnp.maximum(n, 1.0)
  else:  # f is shift-invariant for K >= 2: centre first for float accuracy.
    mean = GroupStats(rewards, group, valid, num_groups).mean
    z = g - jnp.concatenate([mean, jnp.zeros((1,), jnp.float32)])[gs.seg]
    f = _pkpo_sorted(z, gs, k)
  f = jnp.where(n >= k, f, 0.0)
  adv = jnp.where(valid > 0, _unsort(f, gs.order), 0.0)
  metrics = _group_metrics(adv, valid, group, num_groups, k, "max_at_k")
  w = (k / jnp.maximum(n, 1.0)) * _binom_ratio(gs.rank - 1.0, n - 1.0, k - 1)
  est_g = jax.ops.segment_sum(jnp.where(n >= k, w * g, 0.0), gs.seg, num_groups + 1)[:-1]
  counts = jax.ops.segment_sum(valid, group, num_segments=num_groups)
  ok_g = (counts >= k).astype(jnp.float32)
  metrics["adv/max_at_k_est"] = jnp.sum(est_g * ok_g) / jnp.maximum(jnp.sum(ok_g), 1.0)
  return adv, metrics


def _top_gap_weight(a, m, k: int):
  """w(a; m) with D(S) = Σ_j g_j w(a_j; m) = C(m, K)^{-1} Σ_{|Q|=K} (top1_Q - top2_Q), a = rank.

  w(a) = [C(a-1, K-1) - (m-a) C(a-1, K-2)] / C(m, K)     (K >= 2),     1/m     (K = 1)
  """
  k_over_m = k / jnp.maximum(m, 1.0)
  if k == 1:
    return k_over_m * jnp.ones_like(a)
  first = k_over_m * _binom_ratio(a - 1.0, m - 1.0, k - 1)
  second = (
    k_over_m
    * (m - a)
    * _binom_ratio(a - 1.0, m - 1.0, k - 2)
    * (k - 1)
    / jnp.maximum(m - k + 1.0, 1.0)
  )
  return first - second


def maxpo(rewards: jax.Array, group: jax.Array, valid: jax.Array, *, num_groups: int, k: int):
  """MaxPO leave-two-out (L2O) max@K / pass@K advantage (arXiv 2606.06080), as constructed in
  research/methods_A.md §5 (derived there from PKPO + the abstract; properties checked by
  research/maxpo_check.py; the paper's exact normalisation may differ).

  With f(i; S) the PKPO estimator of :func:`max_at_k` and n valid samples in the group:

      A_i = f(i; [n]) - (1/n) Σ_{j≠i} f(j; [n]∖{i})

  The baseline never looks at y_i, so the gradient stays unbiased for ∇ max@K; and Σ_i A_i = 0
  exactly (every K-subset is left out by n-K of the i, and C(n-1, K)/C(n, K) = (n-K)/n).
  The inner sum has the closed form (derived here from the definition of f)

      Σ_{j∈S'} f(j; S') = C(m, K)^{-1} Σ_{Q⊆S', |Q|=K} (top1_Q - top2_Q)
                        = Σ_{j∈S'} g_j w(a_j; m)

  (m = n-1; a_j = rank of j in S', its rank in S minus 1 when j ranks above i), evaluated
  with segmented prefix/suffix sums over the sorted group: O(n log n) per group.
  K = 1 gives (g_i - mean_{j≠i} g_j)/n, RLOO/n. Binary g gives pass@K.

  Args:
    rewards: [B] float32 rewards g; group: [B] int32; valid: [B] float32.
    num_groups: static ``P``.
    k: static K >= 1. Groups with n < K + 1 get 0 (metric ``adv/maxpo_small_groups``).

  Returns:
    ([B] advantages, metrics). Sums to 0 within each group; invariant to a shift of g.
  """
  _check_rows(rewards, group, valid)
  _check_k(k, "needs n >= K + 1 valid rollouts per group")
  gs = _group_sort(rewards, group, valid, num_groups)
  mean = GroupStats(rewards, group, valid, num_groups).mean
  z = rewards[gs.order] - jnp.concatenate([mean, jnp.zeros((1,), jnp.float32)])[gs.seg]
  n, rank = gs.count, gs.rank
  f = z / jnp.maximum(n, 1.0) if k == 1 else _pkpo_sorted(z, gs, k)
  # Leave i out: rows below i keep their rank a, rows above i move to a - 1; m = n - 1.
  x = z * _top_gap_weight(rank, n - 1.0, k)
  y = jnp.where(rank >= 2, z * _top_gap_weight(rank - 1.0, n - 1.0, k), 0.0)
  cx, cy = _seg_cumsum(x, gs.seg), _seg_cumsum(y, gs.seg)
  total_y = jax.ops.segment_sum(y, gs.seg, num_segments=num_groups + 1)[gs.seg]
  left_out = (cx - x) + (total_y - cy)
  a = f - left_out / jnp.maximum(n, 1.0)
  a = jnp.where(n >= k + 1, a, 0.0)
  adv = jnp.where(valid > 0, _unsort(a, gs.order), 0.0)
  return adv, _group_metrics(adv, valid, group, num_groups, k + 1, "maxpo")


# ---------------------------------------------------------------------------------------------
# Registry adapters.


def _rank_entry(fn):
  def entry(inputs, *, num_groups, k):
    return fn(inputs.rewards, inputs.group, inputs.valid, num_groups=num_groups, k=k)

  return entry


# Config name -> adapter over AdvantageInputs.
ADVANTAGES: dict[str, Callable] = {
  "pass_at_k": _rank_entry(pass_at_k),
  "max_at_k": _rank_entry(max_at_k),
  "maxpo": _rank_entry(maxpo),
}
