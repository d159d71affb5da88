"""More advantage estimators: RLOO, REINFORCE++, ReMax, GAE, PKPO pass@K / max@K, MaxPO, OPD, GNDPO.

Shapes: ``B`` sequences (``P`` prompt slots × up to ``G`` rollouts), ``T`` completion tokens,
``K`` of pass@K. Each estimator is a pure function of explicit arrays; :data:`EXTRA_ADVANTAGES`
maps a config name to an adapter with the signature of ``advantages.ADVANTAGES``::

    fn(inputs: AdvantageInputs, *, num_groups: int, **hparams)
        -> (advantages [B] or [B, T] f32, metrics dict)

Group estimators read ``group [B]`` (prompt slot, any order, need not be contiguous) and
``valid [B]``; a padding row (``valid = 0``) enters no statistic and gets advantage 0, so variable
group sizes run through one compiled shape. Rank-based estimators (pass@K, max@K, MaxPO) sort the
rows by (group, reward) once and use segmented prefix sums: O(B log B), no [B, B] arrays.
:data:`VALUE_LOSSES` holds the critic losses that go with GAE.
"""

from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp

from posttrain_jax.objectives.advantages import AdvantageInputs, GroupStats
from posttrain_jax.objectives.reductions import aggregate, masked_mean, masked_var, masked_whiten

sg = jax.lax.stop_gradient


# ---------------------------------------------------------------------------------------------
# Shared helpers.

def _check_rows(*arrays):
  """rewards-like [B] float, group [B] int, valid [B] float (in that order, more floats after)."""
  chex.assert_rank(list(arrays), 1)
  chex.assert_equal_shape(list(arrays))
  chex.assert_type(list(arrays), [float, int, float] + [float] * (len(arrays) - 3))


def _check_tokens(*arrays):
  chex.assert_rank(list(arrays), 2)
  chex.assert_equal_shape(list(arrays))
  chex.assert_type(list(arrays), float)


def _row_metrics(adv: jax.Array, weight: jax.Array) -> dict:
  """Mean, |mean|, std, min and max of ``adv`` over entries with ``weight > 0``."""
  ok = weight > 0
  some = jnp.any(ok)
  return {
      "adv/mean": masked_mean(adv, weight),
      "adv/abs_mean": masked_mean(jnp.abs(adv), weight),
      "adv/std": jnp.sqrt(masked_var(adv, weight)),
      "adv/max": jnp.where(some, jnp.max(jnp.where(ok, adv, -jnp.inf)), 0.0),
      "adv/min": jnp.where(some, jnp.min(jnp.where(ok, adv, jnp.inf)), 0.0),
  }


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


def _group_metrics(adv, valid, group, num_groups: int, enough_rows: int, name: str):
  """Row metrics plus the fraction of real groups with fewer than ``enough_rows`` valid rows."""
  metrics = _row_metrics(adv, valid)
  counts = jax.ops.segment_sum(valid, group, num_segments=num_groups)
  real = counts > 0
  small = jnp.sum(real & (counts < enough_rows)) / jnp.maximum(jnp.sum(real), 1)
  metrics[f"adv/{name}_small_groups"] = small.astype(jnp.float32)
  return metrics


# ---------------------------------------------------------------------------------------------
# Reward-level baselines: RLOO, REINFORCE++, ReMax.

def rloo(rewards: jax.Array, group: jax.Array, valid: jax.Array, *, num_groups: int):
  """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics", eq. 5).

      A_i = r_i - 1/(n-1) Σ_{j∈g(i), j≠i} r_j  =  n/(n-1) · (r_i - mean_{g(i)} r)

  over the ``n`` valid rows of the group; a group with a single rollout gets 0.

  Args:
    rewards: [B] float32 sequence rewards.
    group: [B] int32 prompt slot of each row.
    valid: [B] float32, 1 for a real rollout, 0 for padding.
    num_groups: static number of prompt slots ``P``.

  Returns:
    ([B] advantages, metrics). Sums to 0 within every group; invariant to a reward shift.
  """
  _check_rows(rewards, group, valid)
  stats = GroupStats(rewards, group, valid, num_groups)
  n = stats.count[group]
  adv = (rewards - stats.mean[group]) * n / jnp.maximum(n - 1.0, 1.0)
  adv = jnp.where((valid > 0) & (n > 1), adv, 0.0)
  return adv, _group_metrics(adv, valid, group, num_groups, 2, "rloo")


def reinforce_pp(rewards: jax.Array, valid: jax.Array, *, eps: float = 1e-8):
  """REINFORCE++ advantage (Hu 2025, "REINFORCE++", sequence-reward form): batch whitening.

      A_i = (r_i - mean_batch r) / (std_batch r + eps)

  mean and (population) std over the valid rows of the whole batch, no per-prompt baseline. The
  paper's per-token KL-in-reward shaping is left to the KL loss terms.

  Args:
    rewards: [B] float32 sequence rewards.
    valid: [B] float32 row mask.
    eps: added to the std.

  Returns:
    ([B] advantages, metrics). Invariant to a shift and a positive scale of the rewards.
  """
  chex.assert_rank([rewards, valid], 1)
  chex.assert_equal_shape([rewards, valid])
  chex.assert_type([rewards, valid], float)
  adv = masked_whiten(rewards, valid, eps=eps)
  return adv, _row_metrics(adv, valid)


def reinforce_pp_baseline(rewards: jax.Array, group: jax.Array, valid: jax.Array, *,
                          num_groups: int, eps: float = 1e-8):
  """REINFORCE++-baseline (Hu 2025): group mean baseline, then batch-global whitening.

      a_i = r_i - mean_{j∈g(i)} r_j;    A_i = (a_i - mean_batch a) / (std_batch a + eps)

  Args:
    rewards: [B] float32; group: [B] int32; valid: [B] float32 (as :func:`rloo`).
    num_groups: static ``P``.
    eps: added to the batch std.

  Returns:
    ([B] advantages, metrics). Shift- and positive-scale-invariant.
  """
  _check_rows(rewards, group, valid)
  stats = GroupStats(rewards, group, valid, num_groups)
  centred = (rewards - stats.mean[group]) * valid
  adv = masked_whiten(centred, valid, eps=eps)
  return adv, _row_metrics(adv, valid)


def remax(rewards: jax.Array, baseline_rewards: jax.Array, valid: jax.Array):
  """ReMax (Li et al. 2023, "ReMax", Alg. 1): the greedy rollout's reward is the baseline.

      A_i = r(x, y_i) - r(x, ŷ_greedy(x))

  Args:
    rewards: [B] float32 sampled-rollout rewards.
    baseline_rewards: [B] float32 reward of the greedy rollout of the same prompt.
    valid: [B] float32 row mask.

  Returns:
    ([B] advantages, metrics).
  """
  chex.assert_rank([rewards, baseline_rewards, valid], 1)
  chex.assert_equal_shape([rewards, baseline_rewards, valid])
  chex.assert_type([rewards, baseline_rewards, valid], float)
  adv = jnp.where(valid > 0, rewards - baseline_rewards, 0.0)
  metrics = _row_metrics(adv, valid)
  metrics["adv/baseline_mean"] = masked_mean(baseline_rewards, valid)
  return adv, metrics


# ---------------------------------------------------------------------------------------------
# GAE with a learned critic, and the PPO value loss.

def gae_advantages(rewards: jax.Array, values: jax.Array, mask: jax.Array, *,
                   gamma: float = 1.0, lam: float = 0.95):
  """Generalised advantage estimation (Schulman et al. 2016, eq. 16) over completion tokens.

      δ_t = r_t + γ V_{t'} - V_t,    A_t = δ_t + γλ A_{t'},    R_t = A_t + V_t

  where ``t'`` is the next token with ``mask = 1`` (masked tokens, e.g. tool observations, are
  skipped as in verl) and ``V, A`` after the last token are 0. A reverse ``lax.scan`` over T.

  Args:
    rewards: [B, T] float32 per-token rewards (a sparse terminal reward sits on the last token).
    values: [B, T] float32 critic values V_t (stop-gradient inside).
    mask: [B, T] float32 completion mask.
    gamma: discount γ.
    lam: GAE λ.

  Returns:
    (advantages [B, T], returns [B, T]), both 0 where ``mask = 0`` and both stop-gradient.
  """
  _check_tokens(rewards, values, mask)
  on = mask > 0
  r = jnp.where(on, sg(rewards), 0.0)
  v = jnp.where(on, sg(values), 0.0)

  def step(carry, xs):
    next_value, next_adv = carry
    r_t, v_t, on_t = xs
    adv_t = r_t + gamma * next_value - v_t + gamma * lam * next_adv
    carry = (jnp.where(on_t, v_t, next_value), jnp.where(on_t, adv_t, next_adv))
    return carry, adv_t

  zeros = jnp.zeros(r.shape[:1], jnp.float32)
  _, adv = jax.lax.scan(step, (zeros, zeros), (r.T, v.T, on.T), reverse=True)
  adv = jnp.where(on, adv.T, 0.0)
  returns = jnp.where(on, adv + v, 0.0)
  return adv, returns


def terminal_rewards(rewards: jax.Array, mask: jax.Array) -> jax.Array:
  """[B] sequence rewards -> [B, T] with each reward on the last token where ``mask = 1``."""
  chex.assert_rank([rewards, mask], [1, 2])
  on = mask > 0
  last = mask.shape[1] - 1 - jnp.argmax(on[:, ::-1], axis=1)
  hot = jax.nn.one_hot(last, mask.shape[1], dtype=jnp.float32) * jnp.any(on, axis=1)[:, None]
  return hot * rewards[:, None]


def gae(rewards: jax.Array, values: jax.Array, mask: jax.Array, *, gamma: float = 1.0,
        lam: float = 0.95, whiten: bool = True):
  """PPO token advantages: :func:`gae_advantages` with the sequence reward on the last token.

  Args:
    rewards: [B] float32 sequence rewards (0 for padding rows).
    values: [B, T] float32 critic values.
    mask: [B, T] float32 completion mask (all 0 on padding rows).
    gamma, lam: GAE γ and λ.
    whiten: whiten the advantages over all masked tokens of the batch (returns are not).

  Returns:
    ([B, T] advantages, metrics with ``gae/returns_mean`` and ``gae/values_mean``).
  """
  chex.assert_rank([rewards, values, mask], [1, 2, 2])
  adv, returns = gae_advantages(terminal_rewards(rewards, mask), values, mask,
                                gamma=gamma, lam=lam)
  metrics = {f"gae/raw_{k[4:]}": v for k, v in _row_metrics(adv, mask).items()}
  if whiten:
    adv = masked_whiten(adv, mask)
  metrics.update(_row_metrics(adv, mask))
  metrics["gae/returns_mean"] = masked_mean(returns, mask)
  metrics["gae/values_mean"] = masked_mean(jnp.where(mask > 0, values, 0.0), mask)
  return adv, metrics


def clipped_mse(values: jax.Array, old_values: jax.Array, returns: jax.Array, mask: jax.Array,
                *, clip_eps: float = 0.2, aggregation: str = "token_mean", norm_length=None):
  """PPO clipped value loss (Schulman et al. 2017; the form of the OpenAI baselines / verl).

      V^clip_t = clip(V_t, V^old_t - ε, V^old_t + ε)
      ℓ_t = ½ max((V_t - R_t)², (V^clip_t - R_t)²)

  Args:
    values: [B, T] float32 current critic values (differentiated).
    old_values: [B, T] float32 critic values at rollout time (stop-gradient).
    returns: [B, T] float32 targets R_t, e.g. from :func:`gae_advantages` (stop-gradient).
    mask: [B, T] float32 completion mask.
    clip_eps: ε.
    aggregation: a name in reductions.AGGREGATIONS (default: token mean).
    norm_length: constant length for ``seq_mean_token_sum_norm``.

  Returns:
    (scalar loss, metrics with ``loss/vf_num`` and ``loss/vf_den`` for exact micro-batching).
  """
  _check_tokens(values, old_values, returns, mask)
  on = mask > 0
  v = jnp.where(on, values, 0.0)
  v_old = jnp.where(on, sg(old_values), 0.0)
  target = jnp.where(on, sg(returns), 0.0)
  v_clip = v_old + jnp.clip(v - v_old, -clip_eps, clip_eps)
  err, err_clip = jnp.square(v - target), jnp.square(v_clip - target)
  token_loss = 0.5 * jnp.maximum(err, err_clip)
  agg = aggregate(token_loss, mask, mode=aggregation, norm_length=norm_length)
  resid_var = masked_var(target - v, mask)
  metrics = {
      "loss/vf": agg.value, "loss/vf_num": agg.numerator, "loss/vf_den": agg.denominator,
      "vf/clip_frac": masked_mean((err_clip > err).astype(jnp.float32), mask),
      "vf/explained_var": 1.0 - resid_var / jnp.maximum(masked_var(target, mask), 1e-8),
  }
  return agg.value, metrics


# ---------------------------------------------------------------------------------------------
# pass@K and max@K: PKPO (Walder & Karkhanis 2025) and MaxPO's leave-two-out baseline.

def _check_k(k: int, minimum_rows: str):
  if not isinstance(k, int) or k < 1:
    raise ValueError(f"k must be a positive int (K of pass@K), got {k!r}; {minimum_rows}")


def pass_at_k(rewards: jax.Array, group: jax.Array, valid: jax.Array, *, num_groups: int,
              k: int):
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


def max_at_k(rewards: jax.Array, group: jax.Array, valid: jax.Array, *, num_groups: int,
             k: int):
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
  second = (k_over_m * (m - a) * _binom_ratio(a - 1.0, m - 1.0, k - 2)
            * (k - 1) / jnp.maximum(m - k + 1.0, 1.0))
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
# On-policy distillation token advantages: OPD and GNDPO.

def _distill_scores(logprobs, teacher_logprobs, mask, clip):
  _check_tokens(logprobs, teacher_logprobs, mask)
  s = jnp.where(mask > 0, sg(teacher_logprobs) - sg(logprobs), 0.0)
  clipped = jnp.zeros_like(s) if clip is None else (jnp.abs(s) > clip).astype(jnp.float32)
  if clip is not None:
    s = jnp.clip(s, -clip, clip)
  metrics = {"distill/score_mean": masked_mean(s, mask),
             "distill/score_std": jnp.sqrt(masked_var(s, mask, ddof=1)),
             "distill/clip_frac": masked_mean(clipped, mask)}
  return s, metrics


def opd(logprobs: jax.Array, teacher_logprobs: jax.Array, mask: jax.Array, *,
        clip: float | None = 5.0):
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


def gndpo(logprobs: jax.Array, teacher_logprobs: jax.Array, mask: jax.Array, *,
          clip: float | None = 5.0, eps: float = 1e-8):
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
  adv = jnp.where(mask > 0, (s - mu) / jnp.sqrt(var + eps), 0.0)
  metrics.update(_row_metrics(adv, mask))
  return adv, metrics


# ---------------------------------------------------------------------------------------------
# Registry adapters.

def _token_mask(inputs: AdvantageInputs, name: str) -> jax.Array:
  if inputs.mask is None:
    raise ValueError(f"advantage {name!r} needs AdvantageInputs.mask [B, T]")
  return inputs.mask * inputs.valid[:, None]


def _require(inputs: AdvantageInputs, field: str, name: str, what: str):
  value = getattr(inputs, field)
  if value is None:
    raise ValueError(f"advantage {name!r} needs AdvantageInputs.{field} ({what}); it is None")
  return value


def _rloo_entry(inputs, *, num_groups):
  return rloo(inputs.rewards, inputs.group, inputs.valid, num_groups=num_groups)


def _reinforce_pp_entry(inputs, *, num_groups, eps=1e-8):
  del num_groups
  return reinforce_pp(inputs.rewards, inputs.valid, eps=eps)


def _reinforce_pp_baseline_entry(inputs, *, num_groups, eps=1e-8):
  return reinforce_pp_baseline(inputs.rewards, inputs.group, inputs.valid,
                               num_groups=num_groups, eps=eps)


def _remax_entry(inputs, *, num_groups):
  del num_groups
  base = _require(inputs, "baseline_rewards", "remax", "[B] reward of the greedy rollout")
  return remax(inputs.rewards, base, inputs.valid)


def _gae_entry(inputs, *, num_groups, gamma=1.0, lam=0.95, whiten=True):
  del num_groups
  values = _require(inputs, "values", "gae", "[B, T] critic values")
  rewards = jnp.where(inputs.valid > 0, inputs.rewards, 0.0)
  return gae(rewards, values, _token_mask(inputs, "gae"), gamma=gamma, lam=lam, whiten=whiten)


def _rank_entry(fn):
  def entry(inputs, *, num_groups, k):
    return fn(inputs.rewards, inputs.group, inputs.valid, num_groups=num_groups, k=k)
  return entry


def _distill_entry(fn, name):
  def entry(inputs, *, num_groups, **hparams):
    del num_groups
    teacher = _require(inputs, "teacher_logprobs", name, "[B, T] teacher log-probs")
    student = _require(inputs, "logprobs", name, "[B, T] student log-probs")
    return fn(student, teacher, _token_mask(inputs, name), **hparams)
  return entry


# Config name -> adapter over AdvantageInputs (merged into advantages.ADVANTAGES by the caller).
EXTRA_ADVANTAGES: dict[str, Callable] = {
    "rloo": _rloo_entry,
    "reinforce_pp": _reinforce_pp_entry,
    "reinforce_pp_baseline": _reinforce_pp_baseline_entry,
    "remax": _remax_entry,
    "gae": _gae_entry,
    "pass_at_k": _rank_entry(pass_at_k),
    "max_at_k": _rank_entry(max_at_k),
    "maxpo": _rank_entry(maxpo),
    "opd": _distill_entry(opd, "opd"),
    "gndpo": _distill_entry(gndpo, "gndpo"),
}

# Critic losses: fn(values, old_values, returns, mask, *, clip_eps, ...) -> (loss, metrics).
VALUE_LOSSES: dict[str, Callable] = {
    "clipped_mse": clipped_mse,
}
