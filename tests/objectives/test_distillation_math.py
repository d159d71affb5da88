"""The distillation papers' properties on the math of objectives/divergences.py and
objectives/distillation.py: TS-OPSD (research/methods_B.md §2 d), GKD's JSD limits, GNDPO's
policy gradient by exhaustive enumeration (methods_A.md §2 d) and Feedback Distillation's KL
(methods_B.md §7 d). GNDPO's whitening properties (global mean 0, unbiased variance 1, padding 0,
shift and scale invariance) are tested in test_advantages_extra.py (DistillTest)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

from posttrain_jax import objectives
from posttrain_jax.objectives import divergences as dv


def _ones(b, t):
  return jnp.ones((b, t), jnp.float32)


# ----------------------------------------------------------------------------------------------
# TS-OPSD: forward KL to a tempered teacher, p_T = softmax(z_T / τ).


class TSOPSDTest(parameterized.TestCase):
  def test_tau_one_teacher_equal_student_gives_zero_loss_and_gradient(self):
    z = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 9)) * 3, jnp.float32)
    for name in ("forward", "reverse", "jsd"):
      loss, grad = jax.jit(
        jax.value_and_grad(
          lambda s, t, name=name: objectives.DIVERGENCES[name](
            None, s, t, _ones(2, 3), teacher_temperature=1.0
          )[0]
        )
      )(z, z)
      np.testing.assert_allclose(loss, 0.0, atol=1e-6)
      np.testing.assert_allclose(grad, 0.0, atol=1e-7)
    # The same teacher at τ = 1.5 is not the student: positive loss, nonzero gradient.
    loss, grad = jax.jit(
      jax.value_and_grad(
        lambda s, t: dv.forward_kl_loss(None, s, t, _ones(2, 3), teacher_temperature=1.5)[0]
      )
    )(z, z)
    self.assertGreater(float(loss), 1e-3)
    self.assertGreater(float(jnp.abs(grad).max()), 1e-4)

  def test_tempered_entropy_increases_and_ranking_is_kept(self):
    rng = np.random.default_rng(1)
    z = jnp.asarray(rng.normal(size=(6, 12)) * 2, jnp.float32)
    taus = [0.5, 0.8, 1.0, 1.2, 1.5, 2.0, 4.0]
    entropies = np.stack(
      [np.asarray(dv.token_entropy(jax.nn.log_softmax(z / tau))) for tau in taus]
    )
    self.assertTrue(np.all(np.diff(entropies, axis=0) > 0), entropies)
    self.assertTrue(np.all(entropies[-1] < np.log(12)))
    # The teacher entropy the loss logs is that of softmax(z_T / τ).
    _, m = dv.forward_kl_loss(None, z[None], z[None], _ones(1, 6), teacher_temperature=1.5)
    np.testing.assert_allclose(m["distill/teacher_entropy"], entropies[4].mean(), rtol=1e-5)
    for tau in taus:
      np.testing.assert_array_equal(np.argsort(np.asarray(z / tau), -1), np.argsort(z, -1))

  def test_logit_student_converges_to_teacher_over_tau(self):
    """Gradient descent on the forward KL to a frozen teacher at τ drives a student
    parameterised directly by logits to z0/τ + c (methods_B.md §2 b): same ranking, lower
    sharpness."""
    rng = np.random.default_rng(2)
    z0 = jnp.asarray(rng.normal(size=(1, 2, 8)) * 1.5, jnp.float32)
    tau = 1.5
    grad = jax.jit(
      jax.grad(lambda s: dv.forward_kl_loss(None, s, z0, _ones(1, 2), teacher_temperature=tau)[0])
    )
    student = z0  # Start from the collapsed checkpoint itself.

    def body(_, s):
      return s - 4.0 * grad(s)

    student = jax.lax.fori_loop(0, 3000, body, student)
    gap = np.asarray(student - z0 / tau)
    np.testing.assert_allclose(gap - gap.mean(-1, keepdims=True), 0.0, atol=2e-3)
    np.testing.assert_array_equal(np.argsort(student, -1), np.argsort(z0, -1))
    h = lambda x: dv.token_entropy(jax.nn.log_softmax(x))  # noqa: E731
    self.assertTrue(np.all(np.asarray(h(student)) > np.asarray(h(z0)) + 0.05))


# ----------------------------------------------------------------------------------------------
# GKD's generalised JSD (TRL's beta convention).


class JSDTest(parameterized.TestCase):
  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(3)
    self.zs = jnp.asarray(rng.normal(size=(2, 4, 7)) * 2, jnp.float32)
    self.zt = jnp.asarray(rng.normal(size=(2, 4, 7)) * 2, jnp.float32)
    self.mask = jnp.asarray([[1, 1, 1, 0], [1, 1, 0, 0]], jnp.float32)

  def _jsd(self, beta, zs=None, zt=None):
    zs = self.zs if zs is None else zs
    zt = self.zt if zt is None else zt
    return float(dv.jsd_loss(None, zs, zt, self.mask, beta=beta)[0])

  def test_beta_limits(self):
    forward = float(dv.forward_kl_loss(None, self.zs, self.zt, self.mask)[0])
    reverse = float(dv.reverse_kl_loss(None, self.zs, self.zt, self.mask)[0])
    self.assertGreater(abs(forward - reverse), 0.05)
    self.assertEqual(self._jsd(0.0), forward)  # TRL: beta = 0 is the forward KL(p_T ‖ p_S) ...
    self.assertEqual(self._jsd(1.0), reverse)  # ... and beta = 1 the reverse KL(p_S ‖ p_T).
    # The formula approaches them scaled: JSD_β / β -> forward, JSD_β / (1 - β) -> reverse.
    eps = 1e-4
    np.testing.assert_allclose(self._jsd(eps) / eps, forward, rtol=5e-3)
    np.testing.assert_allclose(self._jsd(1 - eps) / eps, reverse, rtol=5e-3)

  def test_symmetry(self):
    """β weighs the teacher in the mixture: swapping student and teacher maps β to 1 - β, so
    β = 0.5 is symmetric (the Jensen-Shannon divergence), and bounded by log 2."""
    for beta in (0.2, 0.5, 0.9):
      np.testing.assert_allclose(self._jsd(beta, self.zt, self.zs), self._jsd(1 - beta), rtol=1e-5)
    self.assertNotAlmostEqual(self._jsd(0.2), self._jsd(0.8), places=3)
    self.assertLessEqual(self._jsd(0.5), np.log(2.0))
    sharp = 30 * self.zs, -30 * self.zs  # Nearly disjoint supports: JSD(0.5) -> log 2.
    np.testing.assert_allclose(self._jsd(0.5, *sharp), np.log(2.0), rtol=5e-2)


# ----------------------------------------------------------------------------------------------
# GNDPO / OPD: E[Σ_t A_t ∇ log π(y_t | y_<t)] by exhaustive enumeration.

V = 3


def _enumerate(theta1, theta2, teacher1, teacher2, *, returns_to_go=False):
  """Exact E_{y ~ π}[Σ_t A_t ∇ log π(y_t | y_<t)] over all V**2 sequences of a tabular policy
  π(y1) = softmax(θ1), π(y2 | y1) = softmax(θ2[y1]), with A_t from the library's ``opd``
  (clip=None): A_t = log π_T(y_t | y_<t) - log π(y_t | y_<t), stop-gradient. With
  ``returns_to_go``: A_t summed over s >= t."""
  seqs = jnp.asarray(list(itertools.product(range(V), repeat=2)))  # [V², 2]

  def token_logprobs(t1, t2):
    l1 = jax.nn.log_softmax(t1)[seqs[:, 0]]
    l2 = jax.nn.log_softmax(t2)[seqs[:, 0], seqs[:, 1]]
    return jnp.stack([l1, l2], axis=1)  # [V², 2]

  student = token_logprobs(theta1, theta2)
  teacher = token_logprobs(teacher1, teacher2)
  adv, _ = objectives.opd(student, teacher, jnp.ones_like(student), clip=None)
  if returns_to_go:
    adv = jnp.cumsum(adv[:, ::-1], axis=1)[:, ::-1]
  prob = jnp.exp(student.sum(1))  # π(y) of each sequence.

  def surrogate(t1, t2):  # Σ_y sg(π(y)) Σ_t sg(A_t) log π(y_t | y_<t)
    return jnp.sum(
      jax.lax.stop_gradient(prob)[:, None] * jax.lax.stop_gradient(adv) * token_logprobs(t1, t2)
    )

  return jax.grad(surrogate, argnums=(0, 1))(theta1, theta2)


def _kl(logits, teacher_logits):
  """Reverse KL(softmax(logits) ‖ softmax(teacher_logits)) over the last axis."""
  logp, logq = jax.nn.log_softmax(logits), jax.nn.log_softmax(teacher_logits)
  return jnp.sum(jnp.exp(logp) * (logp - logq), axis=-1)


class GNDPOEnumerationTest(parameterized.TestCase):
  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(4)
    self.theta1, self.teacher1 = (
      jnp.asarray(rng.normal(size=V) * 1.5, jnp.float32) for _ in range(2)
    )
    self.theta2, self.teacher2 = (
      jnp.asarray(rng.normal(size=(V, V)) * 1.5, jnp.float32) for _ in range(2)
    )

  def test_one_token_equals_minus_reverse_kl_gradient(self):
    """T = 1: E_{y~π}[A ∇ log π(y)] = -∇ KL(π ‖ π_T), exactly."""
    seqs = jnp.arange(V)
    student = jax.nn.log_softmax(self.theta1)[seqs][:, None]
    teacher = jax.nn.log_softmax(self.teacher1)[seqs][:, None]
    adv, _ = jax.jit(lambda s, t: objectives.opd(s, t, jnp.ones((V, 1)), clip=None))(
      student, teacher
    )
    prob = jnp.exp(student[:, 0])
    pg = jax.jit(jax.grad(lambda th: jnp.sum(prob * adv[:, 0] * jax.nn.log_softmax(th)[seqs])))(
      self.theta1
    )
    exact = jax.jit(jax.grad(_kl))(self.theta1, self.teacher1)
    np.testing.assert_allclose(pg, -exact, atol=1e-6)
    self.assertGreater(float(jnp.abs(exact).max()), 1e-2)

  def test_two_tokens_equal_minus_per_position_kl_gradient_with_prefix_fixed(self):
    """T = 2: the per-token advantage (no returns-to-go) gives exactly -∇ of the sum over
    positions of the per-position reverse KL, with the prefix distribution held fixed:

        -∇ [KL(π(·) ‖ π_T(·)) + Σ_{y1} sg(π(y1)) KL(π(·|y1) ‖ π_T(·|y1))].

    It differs from -∇ of the sequence-level KL(π(y1, y2) ‖ π_T(y1, y2)) (the prefix's
    probability also moves with θ1); returns-to-go recover that one exactly."""
    enumerate_jit = jax.jit(_enumerate, static_argnames="returns_to_go")
    g1, g2 = enumerate_jit(self.theta1, self.theta2, self.teacher1, self.teacher2)
    p1 = jax.nn.softmax(self.theta1)

    def per_position(t1, t2):
      return _kl(t1, self.teacher1) + jnp.sum(jax.lax.stop_gradient(p1) * _kl(t2, self.teacher2))

    def sequence(t1, t2):
      return _kl(t1, self.teacher1) + jnp.sum(jax.nn.softmax(t1) * _kl(t2, self.teacher2))

    e1, e2 = jax.jit(jax.grad(per_position, argnums=(0, 1)))(self.theta1, self.theta2)
    np.testing.assert_allclose(g1, -e1, atol=1e-6)
    np.testing.assert_allclose(g2, -e2, atol=1e-6)
    s1, s2 = jax.jit(jax.grad(sequence, argnums=(0, 1)))(self.theta1, self.theta2)
    np.testing.assert_allclose(g2, -s2, atol=1e-6)  # Position 2's parameters agree ...
    self.assertGreater(float(jnp.abs(g1 + s1).max()), 1e-2)  # ... position 1's do not.
    r1, r2 = enumerate_jit(
      self.theta1, self.theta2, self.teacher1, self.teacher2, returns_to_go=True
    )
    np.testing.assert_allclose(r1, -s1, atol=1e-6)
    np.testing.assert_allclose(r2, -s2, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# Feedback Distillation: KL(π_ema(·|x, f, y_<t) ‖ π_θ(·|x, y_<t)) on student tokens.


class FeedbackDistillationTest(parameterized.TestCase):
  def test_kl_nonnegative_and_zero_without_feedback(self):
    """A teacher conditioned on feedback is a different distribution per token: the forward KL
    is >= 0 on every token; with empty feedback and EMA = student the teacher's logits are the
    student's and the loss and its gradient are 0."""
    rng = np.random.default_rng(5)
    student = jnp.asarray(rng.normal(size=(64, 11)) * 2, jnp.float32)
    shift = jnp.asarray(rng.normal(size=(64, 11)) * 2, jnp.float32)  # What feedback changes.
    per_token = jax.jit(
      lambda s, t: dv.token_forward_kl(jax.nn.log_softmax(s), jax.nn.log_softmax(t))
    )(student, student + shift)
    self.assertTrue(np.all(np.asarray(per_token) >= 0.0))
    self.assertGreater(float(per_token.min()), 0.0)
    mask = jnp.asarray(rng.random((4, 16)) < 0.7, jnp.float32)
    logits = student.reshape(4, 16, 11)
    loss, grad = jax.jit(jax.value_and_grad(lambda s, t: dv.forward_kl_loss(None, s, t, mask)[0]))(
      logits, logits
    )
    np.testing.assert_allclose(loss, 0.0, atol=1e-6)
    np.testing.assert_allclose(grad, 0.0, atol=1e-7)
    loss, _ = dv.forward_kl_loss(None, logits, logits + shift.reshape(4, 16, 11), mask)
    np.testing.assert_allclose(
      loss, np.sum(np.asarray(per_token).reshape(4, 16) * mask) / np.sum(mask), rtol=1e-5
    )
