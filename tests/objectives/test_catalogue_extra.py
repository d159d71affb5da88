"""The pieces verl and TRL users expect (issue 36): OPO and GPG advantages, GMPO, Clip-Cov and
KL-Cov losses, the abs and straight-through k1+ / k3+ KL, and the switchable conventions
(whitening variance, token-weighted REINFORCE++, verl's sum-norm scale, k3 clamp), each against
a numpy loop written from the paper's formula."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from objective_testdata import loss_batch

from posttrain_jax import objectives
from posttrain_jax.objectives import (
  covariance,
  group_baselines,
  kl,
  ppo_family,
  reductions,
  sequence_level,
)


def _rows(seed=0):
  """Rewards, groups (sizes 4, 3, 1 and a flat group of 2), valid rows and token lengths."""
  rng = np.random.default_rng(seed)
  group = np.array([0, 0, 0, 0, 1, 1, 1, 2, 3, 3], np.int32)
  rewards = rng.normal(size=10).astype(np.float32)
  rewards[8:] = 0.7
  lengths = rng.integers(1, 9, size=10).astype(np.float32)
  return rewards, group, np.ones(10, np.float32), lengths


# ----------------------------------------------------------------------------------------------
# Advantages.


def test_opo_is_reward_minus_the_length_weighted_group_mean():
  rewards, group, valid, lengths = _rows()
  got, _ = objectives.ADVANTAGES["opo"](
    objectives.AdvantageInputs(
      jnp.asarray(rewards), jnp.asarray(group), jnp.asarray(valid), mask=_mask(lengths)
    ),
    num_groups=4,
  )
  want = np.zeros(10)
  for i in range(10):
    rows = [j for j in range(10) if group[j] == group[i]]
    if len(rows) > 1:
      base = sum(lengths[j] * rewards[j] for j in rows) / sum(lengths[j] for j in rows)
      want[i] = rewards[i] - base
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(got)[7:] == 0.0)  # a lone row and a flat group: exactly zero
  # Σ l A = 0 per group, and unequal lengths move the baseline away from the plain mean
  for g in range(2):
    assert abs(float(np.sum((lengths * np.asarray(got))[group == g]))) < 1e-4
  dr, _ = group_baselines.dr_grpo(jnp.asarray(rewards), jnp.asarray(group), valid, num_groups=4)
  assert np.max(np.abs(np.asarray(got)[:7] - np.asarray(dr)[:7])) > 1e-3


def _mask(lengths, t=8):
  return jnp.asarray((np.arange(t)[None, :] < lengths[:, None]).astype(np.float32))


@pytest.mark.parametrize("normalize_std", [False, True])
def test_gpg_rescales_by_the_rows_that_carry_gradient(normalize_std):
  rewards, group, valid, _ = _rows()
  got, metrics = group_baselines.gpg(
    jnp.asarray(rewards), jnp.asarray(group), valid, num_groups=4, normalize_std=normalize_std
  )
  carrying = 7  # groups 0 and 1; the lone row (group 2) and the flat group 3 carry none
  alpha = 10 / carrying
  want = np.zeros(10)
  for i in range(7):
    rows = rewards[group == group[i]]
    scale = rows.std(ddof=1) + 1e-6 if normalize_std else 1.0
    want[i] = alpha * (rewards[i] - rows.mean()) / scale
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(metrics["adv/gpg_alpha"], alpha, rtol=1e-6)


def test_gpg_verl_alpha_counts_non_zero_rewards():
  rewards = np.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0], np.float32)
  group = np.array([0, 0, 0, 0, 1, 1, 2, 2], np.int32)
  valid = np.ones(8, np.float32)
  paper, m_paper = group_baselines.gpg(rewards, group, valid, num_groups=3)
  verl, m_verl = group_baselines.gpg(rewards, group, valid, num_groups=3, alpha="nonzero_rewards")
  np.testing.assert_allclose(m_paper["adv/gpg_alpha"], 8 / 4)  # groups 1 and 2 are flat
  np.testing.assert_allclose(m_verl["adv/gpg_alpha"], 8 / 3)  # three rewards are non-zero
  np.testing.assert_allclose(np.asarray(verl), np.asarray(paper) * (8 / 3) / 2, rtol=1e-6)


@pytest.mark.parametrize("whitening", ["population", "unbiased"])
@pytest.mark.parametrize("weigh", ["rows", "tokens"])
def test_reinforce_pp_conventions_against_a_numpy_loop(whitening, weigh):
  rewards, _, valid, lengths = _rows(1)
  got, _ = group_baselines.reinforce_pp(
    jnp.asarray(rewards), valid, whitening=whitening, weigh=weigh, lengths=jnp.asarray(lengths)
  )
  # the reward tiled over each row's tokens (weigh="tokens") or once per row
  values = np.repeat(rewards, lengths.astype(int)) if weigh == "tokens" else rewards
  values = values.astype(np.float64)
  if whitening == "population":
    want = (rewards - values.mean()) / (values.std() + 1e-8)
  else:
    want = (rewards - values.mean()) / np.sqrt(values.var(ddof=1) + 1e-8)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_whitening_conventions_differ_by_bessels_factor():
  x = jnp.asarray(np.random.default_rng(2).normal(size=8), jnp.float32)
  m = jnp.ones(8)
  pop = reductions.masked_whiten(x, m, eps=0.0)
  unb = reductions.masked_whiten(x, m, eps=0.0, whitening="unbiased")
  np.testing.assert_allclose(np.asarray(pop) / np.asarray(unb), np.sqrt(8 / 7), rtol=1e-5)
  flat = jnp.full((5,), 7.3)
  for w in reductions.WHITENINGS:
    assert np.all(
      np.asarray(reductions.masked_whiten(flat, jnp.ones(5), eps=0.0, whitening=w)) == 0
    )
  with pytest.raises(ValueError, match="unknown whitening 'verl'"):
    reductions.masked_whiten(x, m, whitening="verl")


def test_reinforce_pp_tokens_needs_lengths():
  with pytest.raises(ValueError, match="needs the rows' token counts"):
    group_baselines.reinforce_pp(jnp.ones(4), jnp.ones(4), weigh="tokens")


# ----------------------------------------------------------------------------------------------
# Aggregation, KL estimators.


def test_token_sum_norm_is_the_sum_over_the_constant_length():
  new, old, adv, mask = loss_batch()
  token = jnp.asarray(new)
  got = reductions.aggregate(token, jnp.asarray(mask), mode="token_sum_norm", norm_length=16)
  dr = reductions.aggregate(
    token, jnp.asarray(mask), mode="seq_mean_token_sum_norm", norm_length=16
  )
  np.testing.assert_allclose(got.value, (new * mask).sum() / 16, rtol=1e-5)
  np.testing.assert_allclose(got.value, dr.value * new.shape[0], rtol=1e-5)


def test_abs_and_k3_clamp():
  lp = jnp.asarray([[-1.0, -3.0, -0.2]])
  ref = jnp.asarray([[-2.0, -0.1, -3.0]])
  np.testing.assert_allclose(kl.kl_abs(lp, ref), [[1.0, 2.9, 2.8]], rtol=1e-6)
  free = np.asarray(kl.kl_k3(lp, ref))
  bounded = np.asarray(kl.kl_k3(lp, ref, clamp=10.0))
  assert free[0, 1] > 10.0 and bounded[0, 1] == 10.0
  np.testing.assert_allclose(bounded[0, [0, 2]], free[0, [0, 2]])
  g = jax.grad(lambda x: jnp.sum(kl.kl_k3(x, ref, clamp=10.0)))(lp)
  assert float(g[0, 1]) == 0.0 and float(g[0, 0]) != 0.0


@pytest.mark.parametrize("name,base", [("k1+", "k1"), ("k3+", "k3")])
def test_straight_through_estimators_keep_the_value_and_take_k2s_gradient(name, base):
  new, old, _, _ = loss_batch(spread=0.4)
  lp, ref = jnp.asarray(new), jnp.asarray(old)
  est = objectives.KL_ESTIMATORS[name]
  np.testing.assert_allclose(est(lp, ref), objectives.KL_ESTIMATORS[base](lp, ref), rtol=1e-6)
  g = jax.grad(lambda x: jnp.sum(est(x, ref)))(lp)
  np.testing.assert_allclose(g, new - old, rtol=1e-5, atol=1e-6)  # d/dx ½ (x - ref)²


# ----------------------------------------------------------------------------------------------
# Policy losses.


def _gmpo_ref(new, old, adv, mask, lo=0.4, hi=0.4):
  total, rows = 0.0, 0
  for b in range(new.shape[0]):
    toks = [t for t in range(new.shape[1]) if mask[b, t] > 0]
    a = adv[b]
    clipped = []
    for t in toks:
      r = float(new[b, t] - old[b, t])
      clipped.append(min(r, hi) if a > 0 else (max(r, -lo) if a < 0 else 0.0))
    total += -a * np.exp(np.mean(clipped))
    rows += 1
  return total / rows


def test_gmpo_value_gradient_and_clip():
  new, old, adv, mask = loss_batch(spread=0.5)
  fn = lambda x: sequence_level.gmpo(x, old, adv, mask, aggregation="seq_mean_token_mean")[0]
  value, g = jax.value_and_grad(fn)(jnp.asarray(new))
  np.testing.assert_allclose(value, _gmpo_ref(new, old, adv, mask), rtol=1e-5)
  # finite differences on the unclipped tokens; clipped ones get no gradient
  lr = new - old
  over = np.where(adv[:, None] > 0, lr > 0.4, lr < -0.4) & (mask > 0)
  assert over.any() and (~over & (mask > 0)).any()
  np.testing.assert_array_equal(np.asarray(g)[over], 0.0)
  b, t = np.argwhere(~over & (mask > 0))[0]
  h = 1e-3
  up, down = new.copy(), new.copy()
  up[b, t] += h
  down[b, t] -= h
  fd = (_gmpo_ref(up, old, adv, mask) - _gmpo_ref(down, old, adv, mask)) / (2 * h)
  np.testing.assert_allclose(g[b, t], fd, rtol=1e-3)


def test_gmpo_on_policy_is_the_mean_advantage():
  _, old, adv, mask = loss_batch()
  value, _ = sequence_level.gmpo(old, old, adv, mask, aggregation="seq_mean_token_mean")
  np.testing.assert_allclose(value, -adv.mean(), rtol=1e-5)


def _cov(new, adv, mask):
  on = mask > 0
  a = np.broadcast_to(adv[:, None], new.shape)
  return (a - a[on].mean()) * (new - new[on].mean())


def test_clip_cov_drops_the_band_tokens_and_nothing_else():
  new, old, adv, mask = loss_batch(seed=3, b=8, t=6, spread=0.1)
  adv = adv * 3.0
  cov = _cov(new, adv, mask)
  ratio = np.exp(new - old)
  a = adv[:, None]
  pg1, pg2 = -a * ratio, -a * np.clip(ratio, 0.8, 1.2)
  band = (mask > 0) & ~(pg2 > pg1) & (cov > 0.5) & (cov < 5.0)
  assert 1 < band.sum() < (mask > 0).sum()
  kw = dict(clip_cov_ratio=1.0, clip_cov_lb=0.5)  # every band token is taken out
  loss, m = covariance.clip_cov(new, old, adv, mask, **kw)
  token = np.where(band, 0.0, np.maximum(pg1, pg2))
  np.testing.assert_allclose(loss, (token * mask).sum() / mask.sum(), rtol=1e-5)
  np.testing.assert_allclose(m["cov/selected_frac"], band.sum() / mask.sum(), rtol=1e-6)
  g = jax.grad(lambda x: covariance.clip_cov(x, old, adv, mask, **kw)[0])(jnp.asarray(new))
  np.testing.assert_array_equal(np.asarray(g)[band], 0.0)
  # a share of one token takes out the band token of largest covariance only
  _, m1 = covariance.clip_cov(new, old, adv, mask, clip_cov_ratio=1e-6, clip_cov_lb=0.5)
  np.testing.assert_allclose(m1["cov/selected_frac"], 1 / mask.sum(), rtol=1e-6)


def test_kl_cov_penalises_the_top_covariance_tokens():
  new, old, adv, mask = loss_batch(seed=4, b=8, t=6, spread=0.3)
  cov = np.where(mask > 0, _cov(new, adv, mask), -np.inf)
  k = int(np.floor(0.25 * mask.sum()))
  top = np.zeros(new.size, bool)
  top[np.argsort(-cov.reshape(-1), kind="stable")[:k]] = True
  top = top.reshape(new.shape)
  lr = new - old
  token = -adv[:, None] * np.exp(lr) + np.where(top, 0.5 * np.abs(lr), 0.0)
  loss, m = covariance.kl_cov(new, old, adv, mask, kl_cov_ratio=0.25, ppo_kl_coef=0.5)
  np.testing.assert_allclose(loss, (token * mask).sum() / mask.sum(), rtol=1e-5)
  np.testing.assert_allclose(m["cov/selected_frac"], k / mask.sum(), rtol=1e-6)
  plain, _ = ppo_family.ppo_clip(new, old, adv, mask, clip_low=1e9, clip_high=1e9)
  assert float(loss) > float(plain)  # the penalty is there, on top of the unclipped surrogate


def test_top_share_counts_dynamically_and_breaks_ties_by_position():
  score = jnp.asarray([[1.0, 3.0, 3.0, 2.0]])
  eligible = jnp.asarray([[True, True, True, False]])
  got = jax.jit(covariance.top_share)(score, eligible, 0.5, jnp.asarray(4.0))
  np.testing.assert_array_equal(got, [[False, True, True, False]])
  got = covariance.top_share(score, eligible, 0.25, jnp.asarray(4.0))
  np.testing.assert_array_equal(got, [[False, True, False, False]])


def _vespo_ref(new, old, adv, mask, kp=2.0, lp=3.0, kn=3.0, ln=2.0):
  """(value, per-token grad) of the token-mean VESPO loss, φ held fixed."""
  loss = np.zeros(new.shape, np.float64)
  grad = np.zeros(new.shape, np.float64)
  for b in range(new.shape[0]):
    toks = [t for t in range(new.shape[1]) if mask[b, t] > 0]
    log_w = min(max(sum(float(new[b, t] - old[b, t]) for t in toks), np.log(1e-8)), 20.0)
    k, lam = (kp, lp) if adv[b] >= 0 else (kn, ln)
    phi = np.exp(lam) * np.exp(log_w) ** k * np.exp(-lam * np.exp(log_w))
    for t in toks:
      loss[b, t] = -phi * adv[b] * new[b, t]
      grad[b, t] = -phi * adv[b]
  n = mask.sum()
  return loss.sum() / n, grad / n


def test_vespo_against_its_gamma_weight():
  new, old, adv, mask = loss_batch(spread=0.2)
  fn = lambda x: sequence_level.vespo(x, old, adv, mask)[0]
  value, g = jax.value_and_grad(fn)(jnp.asarray(new))
  want_v, want_g = _vespo_ref(new, old, adv, mask)
  np.testing.assert_allclose(value, want_v, rtol=1e-5)
  np.testing.assert_allclose(g, want_g, rtol=1e-4, atol=1e-7)
  # on-policy φ = 1: the plain policy gradient (REINFORCE)
  on, _ = sequence_level.vespo(old, old, adv, mask)
  plain, _ = ppo_family.reinforce(old, old, adv, mask)
  np.testing.assert_allclose(on, plain, rtol=1e-6)
  # far off-policy a response fades: its weight is below 1e-3
  _, m = sequence_level.vespo(old + 3.0 * mask, old, adv, mask)
  assert float(m["vespo/phi_mean"]) < 1e-3


def test_luspo_is_gspo_with_the_length_weighted_sum():
  new, old, adv, mask = loss_batch(spread=0.01)
  a = jax.value_and_grad(lambda x: sequence_level.luspo(x, old, adv, mask)[0])(jnp.asarray(new))
  b = jax.value_and_grad(
    lambda x: sequence_level.gspo(x, old, adv, mask, aggregation="seq_mean_token_sum")[0]
  )(jnp.asarray(new))
  np.testing.assert_allclose(a[0], b[0], rtol=1e-6)
  np.testing.assert_allclose(a[1], b[1], rtol=1e-6)
  # the paper's value: (1/B) Σ_i |y_i| ℓ_i with GSPO's sequence ℓ_i
  s = np.exp(((new - old) * mask).sum(-1) / mask.sum(-1))
  ell = np.maximum(-s * adv, -np.clip(s, 1 - 3e-4, 1 + 4e-4) * adv)
  np.testing.assert_allclose(a[0], np.mean(mask.sum(-1) * ell), rtol=1e-5)


def test_grpo_with_the_batch_std_is_trls_scale_rewards_batch():
  """TRL (grpo_trainer, scale_rewards="batch"): A = (r - group mean) / (nanstd(all r) + 1e-4),
  nanstd unbiased; the group form is scale_rewards="group"."""
  rewards, group, valid, _ = _rows(5)
  got, _ = group_baselines.grpo(
    jnp.asarray(rewards), jnp.asarray(group), valid, num_groups=4, eps=1e-4, std_over="batch"
  )
  means = np.array([rewards[group == g].mean() for g in group])
  want = (rewards - means) / (rewards.astype(np.float64).std(ddof=1) + 1e-4)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  by_group, _ = group_baselines.grpo(jnp.asarray(rewards), jnp.asarray(group), valid, num_groups=4)
  assert np.max(np.abs(np.asarray(by_group) - np.asarray(got))) > 1e-2
