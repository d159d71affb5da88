import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized
from objective_testdata import assert_ppo_clip_pattern, loss_batch

from posttrain_jax.objectives import hysteretic, ppo_family, registries, sequence_level

# The surrogates besides ppo_clip and reinforce (those: test_policy_losses.py).
LOSSES = {
  name: fn for name, fn in registries.POLICY_LOSSES.items() if name not in ("ppo_clip", "reinforce")
}


def _aggregate(loss, mask, mode):
  """Numpy loop reference of reductions.AGGREGATIONS."""
  rows = []
  for b in range(loss.shape[0]):
    tokens = [loss[b, t] for t in range(loss.shape[1]) if mask[b, t] > 0]
    rows.append(tokens)
  if mode == "token_mean":
    return sum(sum(r) for r in rows) / sum(len(r) for r in rows)
  if mode == "seq_mean_token_mean":
    return np.mean([sum(r) / len(r) for r in rows if r])
  if mode == "seq_mean_token_sum":
    return np.mean([sum(r) for r in rows if r])
  raise ValueError(mode)


def _gspo_ref(new, old, adv, mask, lo, hi, mode="token_mean"):
  loss = np.zeros(new.shape, np.float64)
  for b in range(new.shape[0]):
    diffs = [new[b, t] - old[b, t] for t in range(new.shape[1]) if mask[b, t] > 0]
    s = np.exp(min(np.mean(diffs), 10.0))
    a = adv[b]
    loss[b, :] = max(-s * a, -min(max(s, 1 - lo), 1 + hi) * a)
  return _aggregate(loss, mask, mode)


def _sapo_ref(new, old, adv, mask, tau_pos, tau_neg, mode="token_mean"):
  loss = np.zeros(new.shape, np.float64)
  for b in range(new.shape[0]):
    for t in range(new.shape[1]):
      r = np.exp(new[b, t] - old[b, t])
      a = adv[b]
      tau = tau_pos if a > 0 else tau_neg
      loss[b, t] = -a * 4.0 / tau / (1.0 + np.exp(-tau * (r - 1.0)))
  return _aggregate(loss, mask, mode)


def _cispo_ref(new, old, adv, mask, eps_low, eps_high):
  loss = np.zeros(new.shape, np.float64)
  for b in range(new.shape[0]):
    for t in range(new.shape[1]):
      r = np.exp(new[b, t] - old[b, t])
      w = min(r, 1 + eps_high) if eps_low is None else min(max(r, 1 - eps_low), 1 + eps_high)
      loss[b, t] = -w * adv[b] * new[b, t]
  return _aggregate(loss, mask, "token_mean")


def _hpo_ref(new, old, adv, mask, beta, group=None, lo=0.2, hi=0.2, mode="token_mean"):
  """PPO-clip with hysteretic weights; group mode: (1/P) Σ_p Σ_{i∈p,t} ℓ / Σ_{i∈p} L_i."""
  loss = np.zeros(new.shape, np.float64)
  for b in range(new.shape[0]):
    for t in range(new.shape[1]):
      r = np.exp(new[b, t] - old[b, t])
      a = adv[b]
      w = beta if a < 0 else 1.0
      loss[b, t] = w * max(-r * a, -min(max(r, 1 - lo), 1 + hi) * a)
  if group is None:
    return _aggregate(loss, mask, mode)
  total = 0.0
  groups = sorted(set(group.tolist()))
  for p in groups:
    rows = [b for b in range(new.shape[0]) if group[b] == p]
    num = sum(loss[b, t] * mask[b, t] for b in rows for t in range(new.shape[1]))
    total += num / sum(mask[b].sum() for b in rows)
  return total / len(groups)


def _asympo_ref(new, adv, mask):
  """(1/B) Σ_i A_i ℓ_i / sg(ℓ_i) has value Σ A_i / B; returned: value and per-token grads."""
  b_rows = new.shape[0]
  grads = np.zeros(new.shape, np.float64)
  for b in range(b_rows):
    seq_nll = -sum(new[b, t] for t in range(new.shape[1]) if mask[b, t] > 0)
    for t in range(new.shape[1]):
      if mask[b, t] > 0:
        grads[b, t] = -adv[b] / seq_nll / b_rows  # A_i ∇ℓ_i/ℓ_i, ℓ_i = S_i/|y_i|
  return adv.sum() / b_rows, grads


def _spo_ref(new, adv, mask, c):
  loss = np.zeros(new.shape, np.float64)
  for b in range(new.shape[0]):
    w = 1.0 if adv[b] > 0 else c
    loss[b, :] = -w * adv[b] * new[b, :]
  return _aggregate(loss, mask, "seq_mean_token_mean")


def _grad(fn, lp, *args, **kw):
  return np.asarray(jax.grad(lambda x: fn(x, *args, **kw)[0])(lp))


class NumpyReferenceTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters("token_mean", "seq_mean_token_mean")
  def test_gspo(self, mode):
    new, old, adv, mask = loss_batch(spread=0.02)
    fn = self.variant(lambda *a: sequence_level.gspo(*a, aggregation=mode)[0])
    np.testing.assert_allclose(
      fn(new, old, adv, mask), _gspo_ref(new, old, adv, mask, 3e-4, 4e-4, mode), rtol=1e-5
    )

  def test_gspo_log_ratio_clamped_at_10(self):
    new, old, adv, mask = loss_batch()
    new = old + 12.0 * mask  # sequence log-ratio 12 > 10
    adv = -np.abs(adv)  # negative advantages: unclipped branch -s A is taken
    loss, _ = sequence_level.gspo(new, old, adv, mask)
    np.testing.assert_allclose(loss, _gspo_ref(new, old, adv, mask, 3e-4, 4e-4), rtol=1e-5)
    self.assertTrue(np.isfinite(loss))

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters((1.0, 1.05), (0.5, 2.0))
  def test_sapo(self, tau_pos, tau_neg):
    new, old, adv, mask = loss_batch(spread=0.8)
    fn = self.variant(lambda *a: ppo_family.sapo(*a, tau_pos=tau_pos, tau_neg=tau_neg)[0])
    np.testing.assert_allclose(
      fn(new, old, adv, mask), _sapo_ref(new, old, adv, mask, tau_pos, tau_neg), rtol=1e-5
    )

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters((None, 0.28), (0.2, 0.2))
  def test_cispo(self, eps_low, eps_high):
    new, old, adv, mask = loss_batch(spread=0.8)
    fn = self.variant(lambda *a: ppo_family.cispo(*a, eps_low=eps_low, eps_high=eps_high)[0])
    np.testing.assert_allclose(
      fn(new, old, adv, mask), _cispo_ref(new, old, adv, mask, eps_low, eps_high), rtol=1e-5
    )

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters((0.5, "token_mean"), (0.2, "seq_mean_token_mean"))
  def test_hpo(self, beta, mode):
    new, old, adv, mask = loss_batch(spread=0.6)
    fn = self.variant(lambda *a: hysteretic.hpo(*a, beta=beta, aggregation=mode)[0])
    np.testing.assert_allclose(
      fn(new, old, adv, mask), _hpo_ref(new, old, adv, mask, beta, mode=mode), rtol=1e-5
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_hpo_group_mean_length(self):
    new, old, adv, mask = loss_batch(spread=0.6)
    group = np.array([0, 1, 0, 1, 2, 2], np.int32)
    fn = self.variant(lambda *a: hysteretic.hpo(*a, beta=0.3, group=group, num_groups=4)[0])
    np.testing.assert_allclose(
      fn(new, old, adv, mask), _hpo_ref(new, old, adv, mask, 0.3, group=group), rtol=1e-5
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_a_hpo(self):
    new, old, adv, mask = loss_batch(spread=0.6)
    n_pos, n_neg = (adv > 0).sum(), (adv < 0).sum()
    beta = np.clip(n_pos / n_neg, 0.05, 1.0)
    fn = self.variant(lambda *a: hysteretic.a_hpo(*a)[0])
    np.testing.assert_allclose(
      fn(new, old, adv, mask), _hpo_ref(new, old, adv, mask, beta), rtol=1e-5
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_asympo(self):
    new, old, adv, mask = loss_batch()
    value, grads = _asympo_ref(new, adv, mask)
    fn = self.variant(lambda *a: ppo_family.asympo(*a, aggregation="seq_mean_token_sum")[0])
    np.testing.assert_allclose(fn(new, old, adv, mask), value, rtol=1e-5, atol=1e-7)
    g = _grad(ppo_family.asympo, new, old, adv, mask, aggregation="seq_mean_token_sum")
    np.testing.assert_allclose(g, grads, rtol=1e-5, atol=1e-8)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(0.5, 0.25, 1.0)
  def test_spo(self, c):
    new, old, adv, mask = loss_batch()
    fn = self.variant(
      lambda *a: ppo_family.spo(*a, neg_scale=c, aggregation="seq_mean_token_mean")[0]
    )
    np.testing.assert_allclose(fn(new, old, adv, mask), _spo_ref(new, adv, mask, c), rtol=1e-5)


class RatioOneTest(parameterized.TestCase):
  """At ρ = 1 every surrogate's gradient is the policy gradient -A·mask/N (token_mean)."""

  @parameterized.parameters("gspo", "sapo", "cispo", "hpo", "a_hpo", "spo")
  def test_gradient_is_vanilla(self, name):
    _, old, adv, mask = loss_batch()
    kw = {"beta": 1.0} if name == "hpo" else {}
    kw = {"neg_scale": 1.0} if name == "spo" else kw
    if name == "a_hpo":  # balanced signs give β = 1
      adv = np.array([1.0, -1.0, 0.5, -0.5, 2.0, -2.0], np.float32)
    g = _grad(LOSSES[name], old, old, adv, mask, aggregation="token_mean", **kw)
    np.testing.assert_allclose(g, -adv[:, None] * mask / mask.sum(), rtol=1e-5, atol=1e-7)

  @parameterized.parameters("gspo", "hpo")
  def test_clipped_value_is_vanilla(self, name):
    _, old, adv, mask = loss_batch()
    loss, m = LOSSES[name](old, old, adv, mask, **({"beta": 1.0} if name == "hpo" else {}))
    np.testing.assert_allclose(loss, -(adv[:, None] * mask).sum() / mask.sum(), rtol=1e-5)
    np.testing.assert_allclose(m["ratio/clip_frac"], 0.0)

  def test_sapo_value(self):
    """The paper's f(1) = 2/τ: the value is -2A/τ at ρ = 1 (τ by the sign of A)."""
    _, old, adv, mask = loss_batch()
    loss, m = ppo_family.sapo(old, old, adv, mask, tau_pos=1.0, tau_neg=1.05)
    tau = np.where(adv > 0, 1.0, 1.05)[:, None]
    np.testing.assert_allclose(loss, (-2 * adv[:, None] / tau * mask).sum() / mask.sum(), rtol=1e-5)
    np.testing.assert_allclose(m["sapo/grad_weight_mean"], 1.0, rtol=1e-6)

  def test_cispo_value_is_reinforce(self):
    _, old, adv, mask = loss_batch()
    a, _ = ppo_family.cispo(old, old, adv, mask)
    b, _ = ppo_family.reinforce(old, old, adv, mask)
    np.testing.assert_allclose(a, b, rtol=1e-6)

  def test_hpo_beta_scales_negative_gradients(self):
    _, old, adv, mask = loss_batch()
    g = _grad(hysteretic.hpo, old, old, adv, mask, beta=0.25)
    w = np.where(adv < 0, 0.25, 1.0)[:, None]
    np.testing.assert_allclose(g, -w * adv[:, None] * mask / mask.sum(), rtol=1e-5, atol=1e-7)


class GradientRegionTest(parameterized.TestCase):
  def test_gspo_clips_whole_sequences(self):
    _, old, _, mask = loss_batch()
    offsets = np.array([1e-4, 1e-2, -1e-2, 1e-2, -1e-2, 2e-4], np.float32)
    adv = np.array([1.0, 1.0, -1.0, -1.0, 1.0, -1.0], np.float32)
    new = (old + offsets[:, None]).astype(np.float32)
    g = _grad(sequence_level.gspo, new, old, adv, mask)
    clipped = np.array([False, True, True, False, False, False])
    np.testing.assert_array_equal(g[clipped], 0.0)
    np.testing.assert_array_equal(g[mask == 0], 0.0)
    s = np.exp(offsets)[:, None]
    expected = -s * adv[:, None] * mask / mask.sum()
    np.testing.assert_allclose(g[~clipped], expected[~clipped], rtol=1e-4, atol=1e-8)
    self.assertTrue(np.all(g[~clipped][mask[~clipped] > 0] != 0.0))

  def test_hpo_clipped_and_masked_zero(self):
    new, old, adv, mask = loss_batch(spread=1.0)
    g = _grad(hysteretic.hpo, new, old, adv, mask, beta=0.5)
    assert_ppo_clip_pattern(g, new, old, adv, mask)

  def test_cispo_keeps_every_token_with_capped_weight(self):
    new, old, adv, mask = loss_batch(spread=1.0)
    g = _grad(ppo_family.cispo, new, old, adv, mask, eps_high=0.28)
    w = np.minimum(np.exp(new - old), 1.28)
    np.testing.assert_allclose(g, -w * adv[:, None] * mask / mask.sum(), rtol=1e-5, atol=1e-8)
    self.assertTrue((np.exp(new - old)[mask > 0] > 1.28).any())
    self.assertTrue(np.all(g[mask > 0] != 0.0))
    np.testing.assert_array_equal(g[mask == 0], 0.0)

  def test_sapo_soft_gate_attenuates(self):
    _, old, _, mask = loss_batch()
    adv = np.ones(old.shape[0], np.float32)
    new = old.copy()
    new[0, 0] += 3.0  # ρ = e^3: far off-policy
    new[1, 0] += 0.05
    g = _grad(ppo_family.sapo, new, old, adv, mask)
    vanilla = 1.0 / mask.sum()
    self.assertLess(abs(g[0, 0]), 0.05 * vanilla)
    self.assertGreater(abs(g[1, 0]), 0.9 * vanilla)
    near = (mask > 0) & (np.abs(new - old) < 1.0)
    self.assertTrue(np.all(g[near] != 0.0))  # no hard zero near the trust region
    np.testing.assert_array_equal(g[mask == 0], 0.0)
    # τ_neg > τ_pos: the negative-advantage gate decays faster at the same ratio.
    lp = old.copy()
    lp[:, 0] += 1.0
    g_pos = _grad(ppo_family.sapo, lp, old, adv, mask)
    g_neg = _grad(ppo_family.sapo, lp, old, -adv, mask, tau_neg=2.0)
    self.assertLess(abs(g_neg[0, 0]), abs(g_pos[0, 0]))

  @parameterized.parameters(*sorted(LOSSES))
  def test_masked_tokens_get_zero_gradient(self, name):
    new, old, adv, mask = loss_batch(spread=0.3)
    new = np.where(mask > 0, new, -np.inf).astype(np.float32)  # padding may hold -inf
    old = np.where(mask > 0, old, -np.inf).astype(np.float32)
    with np.errstate(invalid="ignore"):  # -inf - -inf on masked slots, discarded by design
      loss, _ = LOSSES[name](new, old, adv, mask)
      g = _grad(LOSSES[name], new, old, adv, mask)
    self.assertTrue(np.isfinite(loss))
    self.assertTrue(np.all(np.isfinite(g)))
    np.testing.assert_array_equal(g[mask == 0], 0.0)

  @parameterized.parameters(*sorted(LOSSES))
  def test_stop_gradient_inputs(self, name):
    new, old, adv, mask = loss_batch()
    w = np.full(new.shape, 0.7, np.float32)
    fn = lambda o, a, ww: LOSSES[name](new, o, a, mask, weights=ww)[0]
    g_old, g_adv, g_w = jax.grad(fn, argnums=(0, 1, 2))(old, adv, w)
    np.testing.assert_array_equal(g_old, 0.0)
    np.testing.assert_array_equal(g_adv, 0.0)
    np.testing.assert_array_equal(g_w, 0.0)

  @parameterized.parameters(*sorted(LOSSES))
  def test_weights_and_per_token_advantages(self, name):
    new, old, adv, mask = loss_batch(spread=0.3)
    base, _ = LOSSES[name](new, old, adv, mask)
    doubled, _ = LOSSES[name](new, old, adv, mask, weights=np.full(new.shape, 2.0, np.float32))
    np.testing.assert_allclose(doubled, 2 * base, rtol=1e-5)
    adv_bt = np.broadcast_to(adv[:, None], new.shape).astype(np.float32)
    per_token, _ = LOSSES[name](new, old, adv_bt, mask)
    np.testing.assert_allclose(per_token, base, rtol=1e-5)


class FiniteDifferenceTest(parameterized.TestCase):
  def _check(self, fn, ref, new):
    g = _grad(fn, new)
    eps = 1e-4
    new64 = new.astype(np.float64)
    for b, t in [(0, 0), (1, 2), (3, 4), (5, 1), (2, 3)]:
      up, down = new64.copy(), new64.copy()
      up[b, t] += eps
      down[b, t] -= eps
      np.testing.assert_allclose(g[b, t], (ref(up) - ref(down)) / (2 * eps), rtol=2e-3, atol=1e-6)

  def test_gspo(self):
    new, old, adv, mask = loss_batch(seed=3, spread=1e-4)
    old64, adv64 = old.astype(np.float64), adv.astype(np.float64)
    # ε wide enough that no sequence is clipped at the kink, small spread for a smooth region.
    fn = lambda lp: sequence_level.gspo(lp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    self._check(fn, lambda lp: _gspo_ref(lp, old64, adv64, mask, 0.2, 0.2), new)
    fn = lambda lp: sequence_level.gspo(lp, old, adv, mask, aggregation="seq_mean_token_mean")
    ref = lambda lp: _gspo_ref(lp, old64, adv64, mask, 3e-4, 4e-4, "seq_mean_token_mean")
    self._check(fn, ref, new)

  def test_sapo(self):
    new, old, adv, mask = loss_batch(seed=4, spread=0.7)
    old64, adv64 = old.astype(np.float64), adv.astype(np.float64)
    fn = lambda lp: ppo_family.sapo(lp, old, adv, mask)
    self._check(fn, lambda lp: _sapo_ref(lp, old64, adv64, mask, 1.0, 1.05), new)


class HPOTest(parameterized.TestCase):
  def test_beta_one_per_response_norm_is_grpo(self):
    new, old, adv, mask = loss_batch(spread=0.6)
    a, _ = hysteretic.hpo(new, old, adv, mask, beta=1.0, aggregation="seq_mean_token_mean")
    b, _ = ppo_family.ppo_clip(new, old, adv, mask, aggregation="seq_mean_token_mean")
    np.testing.assert_allclose(a, b, rtol=1e-6)

  def test_group_mode_token_weight_ignores_own_length(self):
    _, old, adv, mask = loss_batch()
    group = np.array([0, 0, 0, 1, 1, 1], np.int32)
    mask = np.ones_like(mask)
    mask[0, 2:] = 0.0  # response 0 much shorter than its group-mates
    g = _grad(hysteretic.hpo, old, old, adv, mask, beta=1.0, group=group, num_groups=2)
    group_tokens = np.array([mask[:3].sum(), mask[3:].sum()])[group]
    expected = -adv[:, None] * mask / (2 * group_tokens[:, None])
    np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-8)

  def test_zero_advantage_group_gives_zero_loss(self):
    new, old, _, mask = loss_batch()
    loss, _ = hysteretic.hpo(new, old, np.zeros(6, np.float32), mask)
    np.testing.assert_allclose(loss, 0.0, atol=1e-8)

  def test_group_mode_requires_token_mean(self):
    new, old, adv, mask = loss_batch()
    with self.assertRaises(ValueError):
      hysteretic.hpo(
        new,
        old,
        adv,
        mask,
        group=np.zeros(6, np.int32),
        num_groups=1,
        aggregation="seq_mean_token_mean",
      )

  @parameterized.parameters(
    ([1, -1, 1, -1], "ratio", 1.0),
    ([1, -1, -1, -1], "ratio", 1 / 3),
    ([-1, -1, -1, -1], "ratio", 0.05),
    ([1, 1, 0, 0], "ratio", 1.0),
    ([1, -1, -1, -1], "fraction", 0.25),
    ([3, -1, -1, 0], "ratio", 0.5),
  )
  def test_a_hpo_beta(self, signs, rule, expected):
    adv = np.array(signs, np.float32)
    mask = np.ones((4, 3), np.float32)
    beta, m = jax.jit(lambda a, mk: hysteretic.a_hpo_beta(a, mk, rule=rule))(adv, mask)
    np.testing.assert_allclose(beta, expected, rtol=1e-6)
    self.assertTrue(0.05 <= float(beta) <= 1.0)
    np.testing.assert_allclose(m["hpo/n_pos"], (adv > 0).sum())

  def test_a_hpo_beta_bounds_random(self):
    rng = np.random.default_rng(0)
    for _ in range(20):
      adv = rng.normal(size=(8,)).astype(np.float32)
      beta, _ = hysteretic.a_hpo_beta(adv, np.ones((8, 2), np.float32), beta_min=0.1)
      self.assertTrue(0.1 <= float(beta) <= 1.0)


class ASymPOTest(parameterized.TestCase):
  def test_zero_sum_value(self):
    new, old, _, mask = loss_batch()
    adv = np.array([1.0, -0.5, -0.5, 2.0, -1.0, -1.0], np.float32)  # zero-sum groups of 3
    for mode in ("seq_mean_token_sum", "token_mean"):
      loss, _ = ppo_family.asympo(new, old, adv, mask, aggregation=mode)
      np.testing.assert_allclose(loss, 0.0, atol=1e-6)
    g = _grad(ppo_family.asympo, new, old, adv, mask)
    self.assertTrue(np.all(g[mask > 0] != 0.0))

  def test_invariant_to_common_nll_scale(self):
    new, old, adv, mask = loss_batch()
    c = 3.0
    g1 = _grad(ppo_family.asympo, new, old, adv, mask, aggregation="seq_mean_token_sum")
    g2 = _grad(
      ppo_family.asympo,
      (c * new).astype(np.float32),
      old,
      adv,
      mask,
      aggregation="seq_mean_token_sum",
    )
    np.testing.assert_allclose(c * g2, g1, rtol=1e-5)  # ∇log ℓ is scale-free

  def test_spo_c_one_is_naive(self):
    new, old, adv, mask = loss_batch()
    for mode in ("token_mean", "seq_mean_token_mean"):
      a, _ = ppo_family.spo(new, old, adv, mask, neg_scale=1.0, aggregation=mode)
      b, _ = ppo_family.reinforce(new, old, adv, mask, aggregation=mode)
      np.testing.assert_allclose(a, b, rtol=1e-6)


def test_registry_names_and_signature():
  assert set(LOSSES) == {
    "gspo",
    "gmpo",
    "luspo",
    "vespo",
    "sapo",
    "cispo",
    "hpo",
    "a_hpo",
    "asympo",
    "spo",
    "clip_cov",
    "kl_cov",
  }
  new, old, adv, mask = loss_batch()
  for fn in LOSSES.values():
    loss, metrics = fn(
      jnp.asarray(new),
      old,
      adv,
      mask,
      aggregation="seq_mean_token_sum_norm",
      norm_length=8,
      weights=None,
    )
    assert loss.shape == ()
    assert {"loss/pg", "loss/pg_num", "loss/pg_den"} <= set(metrics)
    np.testing.assert_allclose(metrics["loss/pg_den"], 6 * 8)
    assert all("/" in k for k in metrics)
