import itertools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain_jax import objectives
from posttrain_jax.objectives import distillation as dist
from posttrain_jax.objectives import group_baselines as gb
from posttrain_jax.objectives import pass_at_k_family as pk
from posttrain_jax.objectives import value as val
from posttrain_jax.objectives.advantage_inputs import AdvantageInputs

# ----------------------------------------------------------------------------------------------
# Layouts and numpy references (brute force, written independently of the closed forms).


def _layout(sizes, pad_rows=2, seed=0):
  """Rows of groups with the given valid sizes, plus padding rows, in a shuffled order."""
  group = np.concatenate(
    [np.full(n, g) for g, n in enumerate(sizes)] + [np.zeros(pad_rows)]
  ).astype(np.int32)
  valid = np.concatenate([np.ones(sum(sizes)), np.zeros(pad_rows)]).astype(np.float32)
  perm = np.random.default_rng(seed).permutation(len(group))
  return group[perm], valid[perm]


def _groups(group, valid):
  out = {}
  for i, (g, v) in enumerate(zip(group, valid)):
    if v > 0:
      out.setdefault(int(g), []).append(i)
  return out


def _per_group(fn, rewards, group, valid, min_size=1):
  adv = np.zeros(len(rewards))
  for idx in _groups(group, valid).values():
    if len(idx) >= min_size:
      adv[idx] = fn(np.asarray(rewards, np.float64)[idx])
  return adv


def _rloo_ref(r):
  n = len(r)
  return np.zeros(n) if n == 1 else np.array([r[i] - np.delete(r, i).mean() for i in range(n)])


def _pkpo_ref(g, k):
  """f(i; S) = (K/m) mean_{L ⊆ S∖i, |L|=K-1} (g_i - max_L)_+, baseline 0 when K = 1."""
  m = len(g)
  out = np.zeros(m)
  for i in range(m):
    subsets = itertools.combinations([j for j in range(m) if j != i], k - 1)
    vals = [max(g[i] - max(g[j] for j in s), 0.0) if s else g[i] for s in subsets]
    out[i] = k / m * np.mean(vals)
  return out


def _maxpo_ref(g, k):
  n = len(g)
  return np.array([_pkpo_ref(g, k)[i] - _pkpo_ref(np.delete(g, i), k).sum() / n for i in range(n)])


def _whiten_ref(x, eps=1e-8):
  return (x - x.mean()) / (x.std() + eps)


def _gae_ref(rewards, values, mask, gamma, lam):
  """Textbook GAE on each row's subsequence of masked-in tokens, scattered back."""
  adv = np.zeros_like(values, dtype=np.float64)
  for b in range(values.shape[0]):
    idx = np.flatnonzero(mask[b] > 0)
    r, v = rewards[b, idx].astype(np.float64), values[b, idx].astype(np.float64)
    v_next = np.append(v[1:], 0.0)
    delta = r + gamma * v_next - v
    for t in range(len(idx)):
      adv[b, idx[t]] = sum((gamma * lam) ** l * delta[t + l] for l in range(len(idx) - t))
  return adv, np.where(mask > 0, adv + values, 0.0)


# ----------------------------------------------------------------------------------------------
# Reward baselines.


class RewardBaselinesTest(parameterized.TestCase):
  def setUp(self):
    super().setUp()
    self.group, self.valid = _layout([5, 3, 1, 4])
    self.rewards = np.random.default_rng(1).normal(size=len(self.group)).astype(np.float32)

  @chex.variants(with_jit=True, without_jit=True)
  def test_rloo_matches_numpy(self):
    fn = self.variant(lambda r, g, v: gb.rloo(r, g, v, num_groups=5)[0])
    out = np.asarray(fn(self.rewards, self.group, self.valid))
    ref = _per_group(_rloo_ref, self.rewards, self.group, self.valid)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out[self.valid == 0], 0.0)
    for idx in _groups(self.group, self.valid).values():
      self.assertAlmostEqual(float(out[idx].sum()), 0.0, places=5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_reinforce_pp_matches_numpy(self):
    out = np.asarray(self.variant(lambda r, v: gb.reinforce_pp(r, v)[0])(self.rewards, self.valid))
    on = self.valid > 0
    np.testing.assert_allclose(
      out[on], _whiten_ref(self.rewards[on].astype(np.float64)), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_array_equal(out[~on], 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_reinforce_pp_baseline_matches_numpy(self):
    fn = self.variant(lambda r, g, v: gb.reinforce_pp_baseline(r, g, v, num_groups=5)[0])
    out = np.asarray(fn(self.rewards, self.group, self.valid))
    centred = _per_group(lambda r: r - r.mean(), self.rewards, self.group, self.valid)
    on = self.valid > 0
    np.testing.assert_allclose(out[on], _whiten_ref(centred[on]), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[~on], 0.0)

  def test_whitened_ones_are_shift_and_scale_invariant(self):
    r, g, v = self.rewards, self.group, self.valid
    for fn in (
      lambda x: gb.reinforce_pp(x, v)[0],
      lambda x: gb.reinforce_pp_baseline(x, g, v, num_groups=5)[0],
    ):
      np.testing.assert_allclose(fn(3.0 * r - 2.0), fn(r), atol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_remax(self):
    base = np.linspace(-1, 1, len(self.rewards)).astype(np.float32)
    out = np.asarray(
      self.variant(lambda r, b, v: gb.remax(r, b, v)[0])(self.rewards, base, self.valid)
    )
    np.testing.assert_allclose(out, (self.rewards - base) * self.valid, atol=1e-6)

  def test_remax_needs_baseline_rewards(self):
    inputs = AdvantageInputs(jnp.zeros(4), jnp.zeros(4, jnp.int32), jnp.ones(4))
    with self.assertRaisesRegex(ValueError, "baseline_rewards"):
      objectives.ADVANTAGES["remax"](inputs, num_groups=1)


# ----------------------------------------------------------------------------------------------
# GAE and the value loss.


def _gae_batch(seed=0):
  rng = np.random.default_rng(seed)
  b, t = 5, 7
  lengths = np.array([7, 4, 1, 0, 5])
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.float32)
  mask[4, 2] = 0.0  # A hole (e.g. a tool observation) inside row 4.
  values = rng.normal(size=(b, t)).astype(np.float32)
  rewards = rng.normal(size=(b, t)).astype(np.float32) * mask
  return rewards, values, mask


class GAETest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters((1.0, 0.95), (0.9, 0.8), (1.0, 1.0), (0.99, 0.0))
  def test_matches_reverse_loop(self, gamma, lam):
    rewards, values, mask = _gae_batch()
    fn = self.variant(lambda r, v, m: val.gae_advantages(r, v, m, gamma=gamma, lam=lam))
    adv, ret = fn(rewards, values, mask)
    adv_ref, ret_ref = _gae_ref(rewards, values, mask, gamma, lam)
    np.testing.assert_allclose(adv, adv_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, ret_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(adv)[mask == 0], 0.0)

  def test_terminal_reward_gamma_lam_one_is_return_minus_value(self):
    _, values, mask = _gae_batch()
    r = np.array([1.0, -2.0, 0.5, 3.0, 0.25], np.float32)
    adv, m = val.gae(jnp.asarray(r), values, mask, gamma=1.0, lam=1.0, whiten=False)
    np.testing.assert_allclose(adv, (r[:, None] - values) * mask, atol=1e-5)
    self.assertIn("gae/returns_mean", m)

  def test_adapter_whitens_and_zeroes_padding(self):
    _, values, mask = _gae_batch()
    valid = np.array([1, 1, 1, 1, 0], np.float32)
    inputs = AdvantageInputs(
      jnp.arange(5.0),
      jnp.zeros(5, jnp.int32),
      jnp.asarray(valid),
      mask=jnp.asarray(mask),
      values=jnp.asarray(values),
    )
    adv, _ = jax.jit(lambda i: objectives.ADVANTAGES["gae"](i, num_groups=1))(inputs)
    on = (mask * valid[:, None]) > 0
    np.testing.assert_array_equal(np.asarray(adv)[~on], 0.0)
    self.assertAlmostEqual(float(np.asarray(adv)[on].mean()), 0.0, places=5)
    self.assertAlmostEqual(float(np.asarray(adv)[on].std()), 1.0, places=4)
    with self.assertRaisesRegex(ValueError, "values"):
      objectives.ADVANTAGES["gae"](inputs._replace(values=None), num_groups=1)

  def test_no_gradient_into_critic(self):
    rewards, values, mask = _gae_batch()
    grad = jax.grad(lambda v: jnp.sum(sum(val.gae_advantages(rewards, v, mask))))(values)
    np.testing.assert_array_equal(grad, 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_clipped_mse_matches_numpy_and_grads(self):
    rng = np.random.default_rng(3)
    _, _, mask = _gae_batch()
    v, v_old, ret = (rng.normal(size=mask.shape).astype(np.float32) for _ in range(3))
    fn = self.variant(lambda *a: val.VALUE_LOSSES["clipped_mse"](*a, clip_eps=0.2))
    loss, m = fn(v, v_old, ret, mask)
    v_clip = v_old + np.clip(v - v_old, -0.2, 0.2)
    tok = 0.5 * np.maximum((v - ret) ** 2, (v_clip - ret) ** 2)
    np.testing.assert_allclose(loss, (tok * mask).sum() / mask.sum(), rtol=1e-5)
    clip_frac = (((v_clip - ret) ** 2 > (v - ret) ** 2) * mask).sum() / mask.sum()
    np.testing.assert_allclose(m["vf/clip_frac"], clip_frac, rtol=1e-5)
    grads = jax.grad(lambda a, b, c: val.clipped_mse(a, b, c, mask)[0], argnums=(0, 1, 2))(
      v, v_old, ret
    )
    np.testing.assert_array_equal(grads[1], 0.0)
    np.testing.assert_array_equal(grads[2], 0.0)
    self.assertGreater(float(jnp.abs(grads[0]).sum()), 0.0)
    np.testing.assert_array_equal(np.asarray(grads[0])[mask == 0], 0.0)


# ----------------------------------------------------------------------------------------------
# pass@K, max@K and MaxPO.


class RankEstimatorsTest(parameterized.TestCase):
  def setUp(self):
    super().setUp()
    # Groups of 6, 4, 2, 1 valid rows (3 has 0) in shuffled rows; ties in group 0.
    self.group, self.valid = _layout([6, 4, 2, 1, 0], pad_rows=3, seed=2)
    rng = np.random.default_rng(4)
    self.rewards = rng.normal(size=len(self.group)).astype(np.float32)
    first = _groups(self.group, self.valid)[0]
    self.rewards[first[1]] = self.rewards[first[3]]
    self.binary = (rng.random(len(self.group)) < 0.5).astype(np.float32)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(1, 2, 3)
  def test_max_at_k_matches_brute_force(self, k):
    fn = self.variant(lambda r, g, v: pk.max_at_k(r, g, v, num_groups=5, k=k))
    out, metrics = fn(self.rewards, self.group, self.valid)
    ref = _per_group(lambda g: _pkpo_ref(g, k), self.rewards, self.group, self.valid, k)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(out)[self.valid == 0], 0.0)
    if k >= 2:
      self.assertGreaterEqual(float(np.min(out)), -1e-7)  # Not centred: f >= 0.
      shifted = fn(self.rewards + 5.0, self.group, self.valid)[0]
      np.testing.assert_allclose(shifted, out, atol=1e-5)
    # Unbiased max@K estimate: mean over groups of C(n,K)^-1 Σ_{|Q|=K} max_Q.
    est = [
      np.mean([max(self.rewards[list(q)]) for q in itertools.combinations(idx, k)])
      for idx in _groups(self.group, self.valid).values()
      if len(idx) >= k
    ]
    np.testing.assert_allclose(metrics["adv/max_at_k_est"], np.mean(est), rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(1, 2, 3)
  def test_pass_at_k_matches_brute_force(self, k):
    fn = self.variant(lambda r, g, v: pk.pass_at_k(r, g, v, num_groups=5, k=k))
    out, metrics = fn(self.binary, self.group, self.valid)
    ref = _per_group(lambda g: _pkpo_ref(g, k), self.binary, self.group, self.valid, k)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    general, _ = pk.max_at_k(self.binary, self.group, self.valid, num_groups=5, k=k)
    np.testing.assert_allclose(out, general, atol=1e-6)
    self.assertEqual(float(metrics["adv/nonbinary_frac"]), 0.0)
    est = [
      1.0 - math.comb(len(i) - int(self.binary[i].sum()), k) / math.comb(len(i), k)
      for i in _groups(self.group, self.valid).values()
      if len(i) >= k
    ]
    np.testing.assert_allclose(metrics["adv/pass_at_k_est"], np.mean(est), rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(1, 2, 3)
  def test_maxpo_matches_brute_force_and_is_centred(self, k):
    fn = self.variant(lambda r, g, v: pk.maxpo(r, g, v, num_groups=5, k=k))
    out, metrics = fn(self.rewards, self.group, self.valid)
    ref = _per_group(lambda g: _maxpo_ref(g, k), self.rewards, self.group, self.valid, k + 1)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(out)[self.valid == 0], 0.0)
    for idx in _groups(self.group, self.valid).values():
      self.assertAlmostEqual(float(np.asarray(out)[idx].sum()), 0.0, places=6)
    shifted = fn(self.rewards - 7.0, self.group, self.valid)[0]
    np.testing.assert_allclose(shifted, out, atol=1e-5)
    small = sum(0 < len(i) < k + 1 for i in _groups(self.group, self.valid).values()) / 4
    np.testing.assert_allclose(metrics["adv/maxpo_small_groups"], small)

  def test_maxpo_k1_is_rloo_over_n(self):
    out, _ = pk.maxpo(self.rewards, self.group, self.valid, num_groups=5, k=1)
    ref = _per_group(lambda r: _rloo_ref(r) / len(r), self.rewards, self.group, self.valid, 2)
    np.testing.assert_allclose(out, ref, atol=1e-6)

  def test_bad_k_raises(self):
    with self.assertRaisesRegex(ValueError, "positive int"):
      pk.maxpo(self.rewards, self.group, self.valid, num_groups=5, k=0)

  def test_one_compilation_for_all_group_layouts(self):
    @jax.jit
    @chex.assert_max_traces(n=1)
    def fn(r, g, v):
      return pk.maxpo(r, g, v, num_groups=5, k=2)[0]

    for seed in range(3):
      g, v = _layout([4, 3, 5, 2, 1], pad_rows=0, seed=seed)
      v[seed] = 0.0
      fn(self.rewards[:15], g, v)


# Unbiasedness by exhaustive enumeration: every outcome tuple of a group is one group of a batch.


def _enumerated_gradient(estimator, scores, rewards, probs, k):
  """Σ_outcomes P(outcome) Σ_i A_i ∇_θ log π(y_i), with the outcomes of n draws as groups."""
  num_outcomes, n = rewards.shape
  group = np.repeat(np.arange(num_outcomes), n).astype(np.int32)
  perm = np.random.default_rng(0).permutation(group.size)  # Non-contiguous groups.
  flat = rewards.reshape(-1).astype(np.float32)
  adv = np.zeros(group.size)
  fn = jax.jit(lambda r, g, v: estimator(r, g, v, num_groups=num_outcomes, k=k)[0])
  adv[perm] = np.asarray(fn(flat[perm], group[perm], np.ones(group.size, np.float32)))
  adv = adv.reshape(num_outcomes, n)
  return np.einsum("o,oi,oid->d", probs, adv, scores)


def _bernoulli_case(theta, n):
  p = 1.0 / (1.0 + np.exp(-theta))
  ys = np.array(list(itertools.product([0.0, 1.0], repeat=n)))
  probs = np.prod(np.where(ys > 0, p, 1 - p), axis=1)
  return p, ys, probs, (ys - p)[..., None]  # d log π(y)/dθ = y - p.


def _categorical_case(theta, values, n):
  p = np.exp(theta) / np.exp(theta).sum()
  outcomes = np.array(list(itertools.product(range(len(values)), repeat=n)))
  probs = np.prod(p[outcomes], axis=1)
  scores = np.eye(len(values))[outcomes] - p  # d log π(a)/dθ = e_a - p.
  return p, values[outcomes], probs, scores


def _expected_max(theta, values, k):
  """E[max of K i.i.d. draws] = Σ_j v_(j) (F_j^K - F_{j-1}^K), in jnp (differentiable)."""
  order = np.argsort(values)
  cdf = jnp.cumsum(jax.nn.softmax(theta)[order])
  return jnp.sum(values[order] * (cdf**k - jnp.concatenate([jnp.zeros(1), cdf[:-1]]) ** k))


def _expected_max_enum(theta, values, k):
  p = np.exp(theta) / np.exp(theta).sum()
  return sum(
    np.prod(p[list(s)]) * max(values[list(s)])
    for s in itertools.product(range(len(values)), repeat=k)
  )


class UnbiasednessTest(parameterized.TestCase):
  @parameterized.product(name=["pass_at_k", "max_at_k", "maxpo"], k=[1, 3])
  def test_pass_at_k_gradient_bernoulli(self, name, k):
    n, theta = 5, 0.3
    p, ys, probs, scores = _bernoulli_case(theta, n)
    estimate = _enumerated_gradient(getattr(pk, name), scores, ys, probs, k)[0]
    exact = k * p * (1 - p) ** k  # d/dθ [1 - (1-p)^K]
    h = 1e-5
    pass_k = lambda t: 1 - (1 - 1 / (1 + np.exp(-t))) ** k
    np.testing.assert_allclose(exact, (pass_k(theta + h) - pass_k(theta - h)) / (2 * h), rtol=1e-6)
    np.testing.assert_allclose(estimate, exact, rtol=1e-4, atol=1e-6)
    # The same machinery on RLOO (/n) gives ∇pass@1 = p(1-p), which fails the check for K > 1.
    rloo = lambda r, g, v, *, num_groups, k: gb.rloo(r, g, v, num_groups=num_groups)
    rloo_estimate = _enumerated_gradient(rloo, scores, ys, probs, k)[0] / n
    np.testing.assert_allclose(rloo_estimate, p * (1 - p), rtol=1e-4)
    if k > 1:
      self.assertGreater(abs(rloo_estimate - exact), 1e-2)

  @parameterized.product(name=["max_at_k", "maxpo"], k=[2, 3])
  def test_max_at_k_gradient_categorical(self, name, k):
    n = 4
    values = np.array([-0.5, 0.3, 1.0, 0.3])  # A negative reward and a tie.
    theta = np.array([0.2, -0.1, 0.4, -0.3])
    _, rewards, probs, scores = _categorical_case(theta, values, n)
    estimate = _enumerated_gradient(getattr(pk, name), scores, rewards, probs, k)
    exact = np.asarray(jax.grad(_expected_max)(jnp.asarray(theta, jnp.float32), values, k))
    h = 1e-5
    fd = np.array(
      [
        (
          _expected_max_enum(theta + h * e, values, k)
          - _expected_max_enum(theta - h * e, values, k)
        )
        / (2 * h)
        for e in np.eye(len(theta))
      ]
    )
    np.testing.assert_allclose(exact, fd, atol=1e-5)
    np.testing.assert_allclose(estimate, fd, atol=2e-5)


# ----------------------------------------------------------------------------------------------
# On-policy distillation: OPD and GNDPO.


class DistillTest(parameterized.TestCase):
  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(5)
    self.mask = (np.arange(6)[None] < np.array([6, 3, 0, 5])[:, None]).astype(np.float32)
    self.student = rng.normal(-2, 1, size=self.mask.shape).astype(np.float32)
    self.teacher = rng.normal(-2, 1, size=self.mask.shape).astype(np.float32)
    self.teacher[0, 1] = 20.0  # An outlier that the clip catches.
    self.student[self.mask == 0] = -np.inf  # Padding may hold garbage.

  def _scores(self):
    s = np.clip(self.teacher - self.student, -5, 5)
    return s[self.mask > 0].astype(np.float64)

  @chex.variants(with_jit=True, without_jit=True)
  def test_opd_matches_numpy(self):
    out, m = self.variant(lambda *a: dist.opd(*a))(self.student, self.teacher, self.mask)
    np.testing.assert_allclose(np.asarray(out)[self.mask > 0], self._scores(), atol=1e-6)
    np.testing.assert_array_equal(np.asarray(out)[self.mask == 0], 0.0)
    self.assertGreater(float(m["distill/clip_frac"]), 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_gndpo_matches_numpy_and_whitens(self):
    out, _ = self.variant(lambda *a: dist.gndpo(*a))(self.student, self.teacher, self.mask)
    s = self._scores()
    out = np.asarray(out)
    np.testing.assert_allclose(
      out[self.mask > 0], (s - s.mean()) / np.sqrt(s.var(ddof=1) + 1e-8), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_array_equal(out[self.mask == 0], 0.0)
    self.assertAlmostEqual(float(out[self.mask > 0].mean()), 0.0, places=5)
    self.assertAlmostEqual(float(out[self.mask > 0].var(ddof=1)), 1.0, places=4)

  def test_gndpo_invariances_without_clipping(self):
    student, teacher = np.where(self.mask > 0, self.student, 0.0), self.teacher.copy()
    teacher[0, 1] = -1.0
    base, _ = dist.gndpo(student, teacher, self.mask, clip=None)
    shifted, _ = dist.gndpo(student, teacher + 3.0, self.mask, clip=None)
    scaled, _ = dist.gndpo(2.5 * student, 2.5 * teacher, self.mask, clip=None)
    np.testing.assert_allclose(shifted, base, atol=1e-4)
    np.testing.assert_allclose(scaled, base, atol=1e-4)
    opd_shifted, _ = dist.opd(student, teacher + 3.0, self.mask, clip=None)
    self.assertFalse(np.allclose(opd_shifted, dist.opd(student, teacher, self.mask, clip=None)[0]))

  def test_adapters_need_teacher_and_stop_gradient(self):
    valid = np.array([1, 1, 1, 0], np.float32)
    inputs = AdvantageInputs(
      jnp.zeros(4),
      jnp.zeros(4, jnp.int32),
      jnp.asarray(valid),
      mask=jnp.asarray(self.mask),
      logprobs=jnp.asarray(self.student),
    )
    for name in ("opd", "gndpo"):
      with self.assertRaisesRegex(ValueError, "teacher_logprobs"):
        objectives.ADVANTAGES[name](inputs, num_groups=1)
      full = inputs._replace(teacher_logprobs=jnp.asarray(self.teacher))
      adv, _ = objectives.ADVANTAGES[name](full, num_groups=1, clip=4.0)
      np.testing.assert_array_equal(np.asarray(adv)[3], 0.0)  # Padding row.
      grad = jax.grad(
        lambda t: jnp.sum(
          objectives.ADVANTAGES[name](full._replace(teacher_logprobs=t), num_groups=1)[0]
        )
      )(jnp.asarray(self.teacher))
      np.testing.assert_array_equal(grad, 0.0)


# ----------------------------------------------------------------------------------------------
# Registry and properties.


def test_registry_runs_every_estimator_under_jit():
  b, t = 8, 5
  rng = np.random.default_rng(6)
  mask = np.ones((b, t), np.float32)
  inputs = AdvantageInputs(
    rewards=jnp.asarray((rng.random(b) < 0.5).astype(np.float32)),
    group=jnp.asarray(np.repeat([0, 1], 4), jnp.int32),
    valid=jnp.ones(b),
    mask=jnp.asarray(mask),
    logprobs=jnp.asarray(-rng.random((b, t)), jnp.float32),
    teacher_logprobs=jnp.asarray(-rng.random((b, t)), jnp.float32),
    values=jnp.asarray(rng.normal(size=(b, t)), jnp.float32),
    baseline_rewards=jnp.full((b,), 0.5),
    token_rewards=jnp.asarray(rng.normal(size=(b, t)), jnp.float32),
    milestones=jnp.asarray(rng.integers(-1, 3, size=(b, t)), jnp.int32),
    hidden=jnp.asarray(rng.normal(size=(b, t, 4)), jnp.float32),
  )
  expected = {
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "reinforce_pp_token",
    "remax",
    "opo",
    "gpg",
    "gae",
    "pass_at_k",
    "max_at_k",
    "maxpo",
    "opd",
    "gndpo",
    "numca",
    "hista",
  }
  assert set(objectives.ADVANTAGES) == expected
  for name, fn in objectives.ADVANTAGES.items():
    hp = {"k": 2} if name in ("pass_at_k", "max_at_k", "maxpo") else {}
    adv, metrics = jax.jit(lambda i, fn=fn, hp=hp: fn(i, num_groups=2, **hp))(inputs)
    assert adv.shape in ((b,), (b, t)) and adv.dtype == jnp.float32, name
    assert all(np.isfinite(v) for v in jax.tree.leaves(metrics)), name
    assert all("/" in key for key in metrics), name


_maxpo_jit = jax.jit(lambda r, g, v: pk.maxpo(r, g, v, num_groups=2, k=3)[0])
_rloo_jit = jax.jit(lambda r, g, v: gb.rloo(r, g, v, num_groups=2)[0])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-10, 10, width=32), min_size=10, max_size=10), st.floats(-5, 5))
def test_centred_and_shift_invariant_properties(rewards, shift):
  r = np.asarray(rewards, np.float32)
  g = np.array([0, 1] * 5, np.int32)  # Interleaved groups of 5.
  v = np.ones(10, np.float32)
  for fn in (_maxpo_jit, _rloo_jit):
    adv = np.asarray(fn(r, g, v))
    np.testing.assert_allclose([adv[g == 0].sum(), adv[g == 1].sum()], 0.0, atol=1e-4)
    np.testing.assert_allclose(np.asarray(fn(r + np.float32(shift), g, v)), adv, atol=1e-4)
