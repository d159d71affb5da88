"""More advantage estimators: RLOO, REINFORCE++, ReMax, GAE, OPD, GNDPO (and the registry entries
of the rank-based PKPO pass@K / max@K and MaxPO of ``advantages_rank``).

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

from typing import Callable

import chex
import jax
import jax.numpy as jnp

from posttrain_jax.objectives.advantages import (AdvantageInputs, GroupStats, _check_rows,
                                                 _check_tokens, _group_metrics, _row_metrics)
from posttrain_jax.objectives.advantages_rank import max_at_k, maxpo, pass_at_k
from posttrain_jax.objectives.reductions import aggregate, masked_mean, masked_var, masked_whiten
from posttrain_jax.registry import reads

sg = jax.lax.stop_gradient


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


def reinforce_pp_token(token_rewards: jax.Array, mask: jax.Array, *, gamma: float = 1.0,
                       eps: float = 1e-8):
  """REINFORCE++ token advantage (Hu 2025, "REINFORCE++", sections 3.1-3.2): the return to go
  of the per-token rewards (the task reward on the last token, ``-β k1_t`` KL shaping at every
  token), whitened over all masked tokens of the batch:

      G_t = Σ_{s >= t} γ^{s-t} r_s,     A_t = (G_t - mean G) / (std G + eps)

  With no KL shaping (and γ = 1) every token of a row has its sequence reward as return, so
  this is :func:`reinforce_pp` with token-weighted batch statistics.

  Args:
    token_rewards: [B, T] float32. mask: [B, T] float32 (completion mask times valid).
    gamma: discount γ. eps: added to the std.

  Returns:
    ([B, T] advantages, 0 where ``mask = 0``, metrics).
  """
  _check_tokens(token_rewards, mask)
  on = mask > 0
  r = jnp.where(on, token_rewards, 0.0)

  def step(carry, r_t):
    carry = r_t + gamma * carry
    return carry, carry

  _, returns = jax.lax.scan(step, jnp.zeros(r.shape[:1], jnp.float32), r.T, reverse=True)
  adv = masked_whiten(jnp.where(on, returns.T, 0.0), mask, eps=eps)
  return adv, _row_metrics(adv, mask)


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
  return gae_tokens(terminal_rewards(rewards, mask), values, mask, gamma=gamma, lam=lam,
                    whiten=whiten)


def gae_tokens(rewards: jax.Array, values: jax.Array, mask: jax.Array, *, gamma: float = 1.0,
               lam: float = 0.95, whiten: bool = True):
  """:func:`gae` on per-token rewards ``[B, T]`` (e.g. a terminal reward minus a per-token KL
  penalty). Returns ([B, T] advantages, metrics)."""
  adv, returns = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
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


@reads("baseline_rewards")
def _remax_entry(inputs, *, num_groups):
  del num_groups
  base = _require(inputs, "baseline_rewards", "remax", "[B] reward of the greedy rollout")
  return remax(inputs.rewards, base, inputs.valid)


@reads("values", "token_rewards")
def _gae_entry(inputs, *, num_groups, gamma=1.0, lam=0.95, whiten=True):
  del num_groups
  values = _require(inputs, "values", "gae", "[B, T] critic values")
  mask = _token_mask(inputs, "gae")
  if inputs.token_rewards is None:  # the sequence reward on the last token
    rewards = terminal_rewards(jnp.where(inputs.valid > 0, inputs.rewards, 0.0), mask)
  else:
    rewards = jnp.where(mask > 0, inputs.token_rewards, 0.0)
  return gae_tokens(rewards, values, mask, gamma=gamma, lam=lam, whiten=whiten)


@reads("token_rewards")
def _reinforce_pp_token_entry(inputs, *, num_groups, eps=1e-8):
  del num_groups
  rewards = _require(inputs, "token_rewards", "reinforce_pp_token", "[B, T] token rewards")
  return reinforce_pp_token(rewards, _token_mask(inputs, "reinforce_pp_token"), eps=eps)


def _rank_entry(fn):
  def entry(inputs, *, num_groups, k):
    return fn(inputs.rewards, inputs.group, inputs.valid, num_groups=num_groups, k=k)
  return entry


def _distill_entry(fn, name):
  @reads("teacher_logprobs")
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
    "reinforce_pp_token": _reinforce_pp_token_entry,
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
