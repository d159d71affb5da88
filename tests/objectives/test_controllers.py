import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized
from objective_testdata import logprob_pair

from posttrain_jax.objectives import controllers


def _d_hat_ref(trainer, sampler, mask):
  num = den = 0.0
  for b in range(trainer.shape[0]):
    for t in range(trainer.shape[1]):
      if mask[b, t] > 0:
        lr = float(trainer[b, t]) - float(sampler[b, t])
        num += np.exp(lr) - 1 - lr
        den += 1
  return num / den


class DCMDPTermTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_matches_numpy(self):
    trainer, sampler, mask = logprob_pair()
    value, m = self.variant(lambda *a: controllers.dcmdp_term(*a, lam=0.7, delta=0.05))(
      trainer, sampler, mask
    )
    d = _d_hat_ref(trainer, sampler, mask)
    np.testing.assert_allclose(m["dcmdp/d_hat"], d, rtol=1e-5)
    np.testing.assert_allclose(value, 0.7 * (d - 0.05), rtol=1e-5)
    np.testing.assert_allclose(m["dcmdp/d_num"] / m["dcmdp/d_den"], d, rtol=1e-5)

  def test_gradient_flows_through_trainer_only(self):
    trainer, sampler, mask = logprob_pair()
    lam = 0.7
    fn = lambda a, b, l: controllers.dcmdp_term(a, b, mask, lam=l, delta=0.05)[0]
    g_t, g_s, g_l = jax.grad(fn, argnums=(0, 1, 2))(trainer, sampler, lam)
    expected = lam * (np.exp(trainer - sampler) - 1.0) * mask / mask.sum()
    np.testing.assert_allclose(g_t, expected, rtol=1e-4, atol=1e-7)
    np.testing.assert_array_equal(g_s, 0.0)
    np.testing.assert_array_equal(g_l, 0.0)

  def test_zero_lambda_gives_zero_term(self):
    trainer, sampler, mask = logprob_pair()
    value, _ = controllers.dcmdp_term(trainer, sampler, mask, lam=0.0, delta=0.05)
    g = jax.grad(lambda a: controllers.dcmdp_term(a, sampler, mask, lam=0.0, delta=0.05)[0])(
      trainer
    )
    np.testing.assert_array_equal(value, 0.0)
    np.testing.assert_array_equal(g, 0.0)

  def test_k3_nonnegative_and_zero_iff_equal(self):
    trainer, sampler, mask = logprob_pair(spread=2.0)
    _, m = controllers.dcmdp_term(trainer, sampler, mask, lam=1.0, delta=0.0)
    self.assertGreater(float(m["dcmdp/d_hat"]), 0.0)
    _, m0 = controllers.dcmdp_term(sampler, sampler, mask, lam=1.0, delta=0.0)
    np.testing.assert_array_equal(m0["dcmdp/d_hat"], 0.0)

  def test_d_hat_estimates_exact_kl(self):
    rng = np.random.default_rng(1)
    mu, pi = rng.dirichlet(np.ones(7)), rng.dirichlet(np.ones(7))
    exact = float((mu * (np.log(mu) - np.log(pi))).sum())
    # Enumeration: the float mask weighs each vocabulary entry by μ.
    _, m = controllers.dcmdp_term(
      np.log(pi)[None].astype(np.float32),
      np.log(mu)[None].astype(np.float32),
      mu[None].astype(np.float32),
      lam=1.0,
      delta=0.0,
    )
    np.testing.assert_allclose(m["dcmdp/d_hat"], exact, rtol=1e-4)
    # Monte Carlo: y ~ μ.
    y = rng.choice(7, size=(100, 1000), p=mu)
    _, m = controllers.dcmdp_term(
      np.log(pi)[y].astype(np.float32),
      np.log(mu)[y].astype(np.float32),
      np.ones(y.shape, np.float32),
      lam=1.0,
      delta=0.0,
    )
    np.testing.assert_allclose(m["dcmdp/d_hat"], exact, rtol=0.05)


class DCMDPUpdateTest(parameterized.TestCase):
  def _run(self, ds, **kw):
    update = jax.jit(lambda s, d: controllers.dcmdp_update(s, {"dcmdp/d_hat": d}, **kw))
    state = controllers.dcmdp_init()
    lams = []
    for d in ds:
      state = update(state, jnp.float32(d))
      lams.append(float(state.lam))
    return np.array(lams)

  @chex.variants(with_jit=True, without_jit=True)
  def test_matches_numpy(self):
    update = self.variant(
      lambda s, m: controllers.dcmdp_update(s, m, lr=0.5, lam_max=1.0, delta=0.1)
    )
    lam, ref = controllers.dcmdp_init(lam0=0.3), 0.3
    for d in (0.5, 0.3, 0.0, 0.05, 2.0, 2.0, 0.0):
      lam = update(lam, {"dcmdp/d_hat": jnp.float32(d)})
      ref = min(max(ref + 0.5 * (d - 0.1), 0.0), 1.0)
      np.testing.assert_allclose(lam.lam, ref, rtol=1e-6, atol=1e-7)

  @parameterized.parameters((False, 0.0), (True, 0.0), (True, 0.2), (False, 0.1))
  def test_lambda_dynamics(self, dead_zone, decay):
    delta = 0.1
    ds = [0.3, 0.25, 0.5, 0.05, 0.0, 0.1, 0.02, 0.4, 0.2, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01]
    lams = self._run(ds, lr=0.2, lam_max=10.0, delta=delta, dead_zone=dead_zone, decay=decay)
    prev = np.concatenate([[0.0], lams[:-1]])
    ds = np.array(ds)
    self.assertTrue(np.all(lams >= 0.0))
    np.testing.assert_array_less(prev[ds > delta], lams[ds > delta])  # rises while D > δ
    self.assertTrue(np.all(lams[ds <= delta] <= prev[ds <= delta]))  # never rises inside
    if dead_zone and decay == 0.0:
      np.testing.assert_array_equal(lams[ds <= delta], prev[ds <= delta])
    if decay > 0 or not dead_zone:
      self.assertLess(lams[-1], lams[-7])  # a long stay inside the region lowers λ

  def test_lambda_capped(self):
    lams = self._run([5.0] * 10, lr=1.0, lam_max=2.0, delta=0.1)
    self.assertEqual(lams.max(), 2.0)
    lams = self._run([0.0] * 5, lr=1.0, lam_max=2.0, delta=0.1)
    np.testing.assert_array_equal(lams, 0.0)


class KLControllerTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters((9.0, "up"), (3.0, "down"), (6.0, "same"), (100.0, "up"))
  def test_adaptive_direction_and_formula(self, kl_value, direction):
    update = self.variant(
      lambda s, m: controllers.adaptive_kl_controller(s, m, n_steps=256, target=6.0, horizon=1000.0)
    )
    state = controllers.kl_controller_init(coef=0.2)
    new = update(state, {"kl/ref": jnp.float32(kl_value)})
    err = np.clip(kl_value / 6.0 - 1.0, -0.2, 0.2)
    np.testing.assert_allclose(new.coef, 0.2 * (1 + err * 256 / 1000.0), rtol=1e-6)
    if direction == "up":
      self.assertGreater(float(new.coef), 0.2)
    elif direction == "down":
      self.assertLess(float(new.coef), 0.2)
    else:
      np.testing.assert_allclose(new.coef, 0.2, rtol=1e-7)

  def test_adaptive_converges_toward_target_side(self):
    state = controllers.kl_controller_init(coef=0.1)
    for _ in range(20):
      state = controllers.adaptive_kl_controller(state, {"kl/ref": 12.0}, n_steps=64, horizon=640.0)
    self.assertAlmostEqual(float(state.coef), 0.1 * 1.02**20, places=5)

  def test_fixed(self):
    state = controllers.kl_controller_init(coef=0.3)
    np.testing.assert_allclose(controllers.fixed_kl_controller(state, {"kl/ref": 99.0}).coef, 0.3)

  def test_a_hpo_controller(self):
    init, update = controllers.CONTROLLERS["a_hpo"]
    state = init()
    state = update(state, {"hpo/n_pos": 2.0, "hpo/n_neg": 6.0})
    np.testing.assert_allclose(state.beta, 1 / 3, rtol=1e-6)
    state = update(state, {"hpo/n_pos": 0.0, "hpo/n_neg": 6.0}, momentum=0.5)
    np.testing.assert_allclose(state.beta, 0.5 * (1 / 3) + 0.5 * 0.05, rtol=1e-6)

  def test_registry_is_jittable(self):
    metrics = {
      "dcmdp/d_hat": jnp.float32(0.3),
      "kl/ref": jnp.float32(1.0),
      "hpo/n_pos": jnp.float32(1.0),
      "hpo/n_neg": jnp.float32(2.0),
    }
    kwargs = {"dcmdp": dict(lr=0.1, lam_max=1.0, delta=0.1), "adaptive_kl": dict(n_steps=8)}
    self.assertEqual(set(controllers.CONTROLLERS), {"dcmdp", "fixed_kl", "adaptive_kl", "a_hpo"})
    for name, (init, update) in controllers.CONTROLLERS.items():
      state = init()
      new = jax.jit(lambda s, m, u=update, k=kwargs.get(name, {}): u(s, m, **k))(state, metrics)
      self.assertEqual(type(new), type(state))
      chex.assert_trees_all_equal_shapes_and_dtypes(new, state)
