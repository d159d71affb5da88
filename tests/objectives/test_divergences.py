"""objectives/divergences.py: the DIVERGENCES registry of distillation loss terms, checked against
numpy loops, for gradients (to the student only, none on masked tokens or to the teacher) and
for the chunked large-vocabulary path (same values and gradients, smaller temporaries)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from posttrain_jax import objectives
from posttrain_jax.objectives import divergences as dv
from posttrain_jax.registry import ConfigError

FULL = ("forward", "reverse", "jsd")
SAMPLED = ("k1", "k2", "k3")


def _softmax64(z):
  z = np.asarray(z, np.float64)
  e = np.exp(z - z.max())
  return e / e.sum()


def _kl64(p, q):
  on = p > 0
  return float((p[on] * (np.log(p[on]) - np.log(q[on]))).sum())


def _token_ref(name, zs, zt, tau, beta):
  """The per-token divergence in float64, written from the definitions."""
  p_s, p_t = _softmax64(zs), _softmax64(np.asarray(zt, np.float64) / tau)
  if name == "forward" or (name == "jsd" and beta == 0.0):
    return _kl64(p_t, p_s)
  if name == "reverse" or (name == "jsd" and beta == 1.0):
    return _kl64(p_s, p_t)
  mix = beta * p_t + (1 - beta) * p_s
  return beta * _kl64(p_t, mix) + (1 - beta) * _kl64(p_s, mix)


def _loss_ref(name, zs, zt, mask, tau=1.0, beta=0.5):
  num = ent = 0.0
  for b in range(mask.shape[0]):
    for t in range(mask.shape[1]):
      if mask[b, t] > 0:
        num += mask[b, t] * _token_ref(name, zs[b, t], zt[b, t], tau, beta)
        p_t = _softmax64(np.asarray(zt[b, t], np.float64) / tau)
        ent += mask[b, t] * -(p_t * np.log(p_t)).sum()
  den = mask.sum()
  return num / den, num, den, ent / den


def _fixture(b=3, t=4, v=7, seed=0):
  rng = np.random.default_rng(seed)
  zs = rng.normal(size=(b, t, v)).astype(np.float32)
  zt = (2.0 * rng.normal(size=(b, t, v))).astype(np.float32)
  mask = (np.arange(t)[None] < np.array([4, 2, 3])[:b, None]).astype(np.float32)
  return zs, zt, mask


def _call(name, zs, zt, mask, **hp):
  """Any entry through the one signature: fn(logprobs, logits, teacher, mask, **hp)."""
  fn = objectives.DIVERGENCES[name]
  if name in SAMPLED:
    return fn(zs, None, zt, mask, **hp)
  return fn(None, zs, zt, mask, **hp)


class FullVocabularyTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(
    ("forward", 1.7, 0.5),
    ("reverse", 0.6, 0.5),
    ("jsd", 1.5, 0.2),
    ("jsd", 1.0, 0.0),
    ("jsd", 1.0, 1.0),
  )
  def test_matches_numpy(self, name, tau, beta):
    zs, zt, mask = _fixture()
    hp = {"teacher_temperature": tau, **({"beta": beta} if name == "jsd" else {})}
    value, m = self.variant(lambda a, b, c: _call(name, a, b, c, **hp))(zs, zt, mask)
    ref, num, den, ent = _loss_ref(name, zs, zt, mask, tau, beta)
    np.testing.assert_allclose(value, ref, rtol=2e-5)
    np.testing.assert_allclose(m[f"distill/{name}"], ref, rtol=2e-5)
    np.testing.assert_allclose(m[f"distill/{name}_num"], num, rtol=2e-5)
    self.assertEqual(float(m[f"distill/{name}_den"]), den)
    np.testing.assert_allclose(m["distill/teacher_entropy"], ent, rtol=2e-5)
    self.assertGreater(float(value), 0.01)
    self.assertEqual(value.dtype, jnp.float32)

  def test_nonnegative_and_zero_at_equal(self):
    rng = np.random.default_rng(4)
    logp_s = jax.nn.log_softmax(jnp.asarray(3 * rng.normal(size=(200, 6)), jnp.float32))
    logp_t = jax.nn.log_softmax(jnp.asarray(3 * rng.normal(size=(200, 6)), jnp.float32))
    per_token = {
      "forward": dv.token_forward_kl,
      "reverse": dv.token_reverse_kl,
      "jsd": lambda s, t: dv.token_generalized_jsd(s, t, beta=0.3),
    }
    for name, fn in per_token.items():
      self.assertGreater(float(jnp.min(jax.jit(fn)(logp_s, logp_t))), 0.0, name)
      np.testing.assert_allclose(jax.jit(fn)(logp_s, logp_s), 0.0, atol=1e-6)
      zs, _, mask = _fixture(seed=4)  # Teacher logits equal up to a constant: the same p_T.
      np.testing.assert_allclose(_call(name, zs, zs + 5.0, mask)[0], 0.0, atol=1e-6)

  def test_forward_gradient_is_p_s_minus_p_t_over_tokens(self):
    zs, zt, mask = _fixture(seed=5)
    tau = 1.3

    def mean_and_sum(z):
      value, m = _call("forward", z, zt, mask, teacher_temperature=tau)
      return value, m["distill/forward_num"]

    grad, per_token = jax.jit(jax.jacrev(mean_and_sum))(zs)
    p_s = jax.nn.softmax(zs.astype(np.float64), -1)
    p_t = jax.nn.softmax(zt.astype(np.float64) / tau, -1)
    np.testing.assert_allclose(grad, (p_s - p_t) * mask[..., None] / mask.sum(), atol=1e-7)
    # The masked sum (the per-token terms before the mean) has gradient p_S - p_T per token.
    np.testing.assert_allclose(per_token[mask > 0], (p_s - p_t)[mask > 0], atol=1e-6)
    np.testing.assert_array_equal(np.asarray(per_token)[mask == 0], 0.0)

  @parameterized.parameters(*FULL)
  def test_masked_tokens_get_exactly_zero_gradient_even_with_garbage(self, name):
    zs, zt, mask = _fixture(seed=6)
    zs[mask == 0] = np.nan  # Padding may hold anything.
    zt[mask == 0] = -np.inf
    zs[0, 0, :3] = zt[0, 0, :3] = -np.inf  # Tokens both rule out (zero probability).
    if name != "reverse":  # Tokens only the teacher rules out (reverse KL is +inf there).
      zt[1, 0, :2] = -np.inf
    hp = {"beta": 0.4} if name == "jsd" else {}
    value, grad = jax.jit(jax.value_and_grad(lambda z, t: _call(name, z, t, mask, **hp)[0]))(zs, zt)
    self.assertTrue(np.isfinite(float(value)))
    self.assertTrue(np.all(np.isfinite(grad)))
    np.testing.assert_array_equal(np.asarray(grad)[mask == 0], 0.0)
    self.assertGreater(float(np.abs(np.asarray(grad)[mask > 0]).sum()), 0.0)

  def test_bf16_inputs_are_computed_in_float32(self):
    zs, zt, mask = _fixture(seed=7)
    zs16, zt16 = jnp.asarray(zs, jnp.bfloat16), jnp.asarray(zt, jnp.bfloat16)
    for name in FULL:
      value, grad = jax.jit(jax.value_and_grad(lambda z, t, name=name: _call(name, z, t, mask)[0]))(
        zs16, zt16
      )
      self.assertEqual(value.dtype, jnp.float32)
      self.assertEqual(grad.dtype, jnp.bfloat16)
      ref = _loss_ref(name, np.asarray(zs16, np.float32), np.asarray(zt16, np.float32), mask)[0]
      np.testing.assert_allclose(value, ref, rtol=2e-5)


class EveryEntryTest(parameterized.TestCase):
  @parameterized.parameters(*(FULL + SAMPLED))
  def test_no_gradient_reaches_the_teacher(self, name):
    zs, zt, mask = _fixture(seed=8)
    if name in SAMPLED:
      zs, zt = jax.nn.log_softmax(zs)[..., 0], jax.nn.log_softmax(zt)[..., 0]
    grad = jax.grad(lambda t: _call(name, zs, t, mask)[0])(jnp.asarray(zt))
    np.testing.assert_array_equal(grad, 0.0)
    if name in FULL:  # The chunked path too (its own custom gradient).
      grad = jax.grad(lambda t: _call(name, zs, t, mask, chunk=2)[0])(jnp.asarray(zt))
      np.testing.assert_array_equal(grad, 0.0)
    student = jax.grad(lambda s: _call(name, s, zt, mask)[0])(jnp.asarray(zs))
    self.assertGreater(float(jnp.abs(student).sum()), 0.0)

  def test_registry_signature_reads_and_metrics(self):
    self.assertEqual(set(objectives.DIVERGENCES), set(FULL + SAMPLED))
    b, t, v = 2, 3, 5
    rng = np.random.default_rng(9)
    logits = jnp.asarray(rng.normal(size=(b, t, v)), jnp.float32)
    teacher_logits = jnp.asarray(rng.normal(size=(b, t, v)), jnp.float32)
    logprobs = jax.nn.log_softmax(logits)[..., 1]
    teacher = {
      "teacher_logits": teacher_logits,
      "teacher_logprobs": jax.nn.log_softmax(teacher_logits)[..., 1],
    }
    mask = jnp.asarray([[1, 1, 0], [1, 0, 0]], jnp.float32)
    for name, fn in objectives.DIVERGENCES.items():
      (field,) = fn.reads
      self.assertEqual(field, "teacher_logits" if name in FULL else "teacher_logprobs")
      value, m = jax.jit(fn)(logprobs, logits, teacher[field], mask)
      self.assertEqual(value.shape, ())
      self.assertEqual(float(m[f"distill/{name}_den"]), 3.0)
      np.testing.assert_allclose(m[f"distill/{name}"] * 3.0, m[f"distill/{name}_num"], rtol=1e-6)
      self.assertEqual("distill/teacher_entropy" in m, name in FULL)
    self.assertIs(objectives.lookup(objectives.DIVERGENCES, "jsd", "divergence"), dv.jsd_loss)
    with pytest.raises(ConfigError, match="valid divergence"):
      objectives.lookup(objectives.DIVERGENCES, "kl", "divergence")

  def test_bad_inputs_raise_clear_errors(self):
    zs, zt, mask = _fixture()
    with pytest.raises(ValueError, match="same vocabulary"):
      dv.forward_kl_loss(None, zs, zt[..., :5], mask)
    with pytest.raises(ValueError, match=r"beta must be in \[0, 1\]"):
      dv.jsd_loss(None, zs, zt, mask, beta=1.5)
    with pytest.raises(ValueError, match="teacher_temperature must be > 0"):
      dv.reverse_kl_loss(None, zs, zt, mask, teacher_temperature=0.0)
    with pytest.raises(ValueError, match="chunk must be >= 0"):
      dv.forward_kl_loss(None, zs, zt, mask, chunk=-1)


class SampledTokenTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_match_numpy(self):
    rng = np.random.default_rng(10)
    lp = np.log(rng.uniform(0.05, 1.0, (3, 4))).astype(np.float32)
    lt = np.log(rng.uniform(0.05, 1.0, (3, 4))).astype(np.float32)
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], np.float32)
    lp[mask == 0], lt[mask == 0] = np.nan, -np.inf  # Padding garbage is ignored.
    d = (lp - lt)[mask > 0].astype(np.float64)
    refs = {"k1": d, "k2": 0.5 * d**2, "k3": np.exp(-d) - 1 + d}
    for name in SAMPLED:
      value, m = self.variant(lambda a, b, c, name=name: _call(name, a, b, c))(lp, lt, mask)
      np.testing.assert_allclose(value, refs[name].mean(), rtol=1e-5)
      np.testing.assert_allclose(m[f"distill/{name}_num"], refs[name].sum(), rtol=1e-5)
      grad = jax.grad(lambda x, name=name: _call(name, x, lt, mask)[0])(lp)
      np.testing.assert_array_equal(np.asarray(grad)[mask == 0], 0.0)

  def test_expected_gradients_by_enumeration(self):
    """As losses on samples y ~ π_S of one categorical: E[∇k1] = 0, E[∇k2] = ∇ KL(π_S ‖ π_T)
    (the reverse KL), E[∇k3] = ∇ KL(π_T ‖ π_S) (the forward KL). Exact sums over all y."""
    rng = np.random.default_rng(11)
    v = 5
    theta = jnp.asarray(rng.normal(size=v), jnp.float32)
    log_t = jax.nn.log_softmax(jnp.asarray(rng.normal(size=v), jnp.float32))
    ys = jnp.arange(v)
    mask = jnp.ones((v, 1), jnp.float32)

    def expected_grad(name):
      probs = jax.nn.softmax(theta)

      def surrogate(th):  # Σ_y sg(π(y)) · loss(y): the expectation of the per-sample gradient.
        lp = jax.nn.log_softmax(th)[ys][:, None]
        per_sample = jax.vmap(lambda l, t: _call(name, l[None], t[None], mask[:1])[0])(
          lp, log_t[ys][:, None]
        )
        return jnp.sum(jax.lax.stop_gradient(probs) * per_sample)

      return jax.jit(jax.grad(surrogate))(theta)

    reverse = jax.grad(lambda th: jnp.sum(jax.nn.softmax(th) * (jax.nn.log_softmax(th) - log_t)))
    forward = jax.grad(lambda th: jnp.sum(jnp.exp(log_t) * (log_t - jax.nn.log_softmax(th))))
    np.testing.assert_allclose(expected_grad("k1"), 0.0, atol=1e-6)
    np.testing.assert_allclose(expected_grad("k2"), reverse(theta), atol=1e-5)
    np.testing.assert_allclose(expected_grad("k3"), forward(theta), atol=1e-5)
    self.assertGreater(float(jnp.abs(reverse(theta) - forward(theta)).max()), 1e-2)


class ChunkedPathTest(parameterized.TestCase):
  def test_chunk_size(self):
    b, v = 4, 1000
    self.assertEqual(dv.chunk_size(b, dv.CHUNK_THRESHOLD // (b * v), v), 0)  # Fits: no chunks.
    t = 2048
    cap = dv.CHUNK_THRESHOLD // (b * v)
    auto = dv.chunk_size(b, t, v)
    self.assertTrue(0 < auto <= cap and t % auto == 0 and 2 * auto > cap, (auto, cap))
    self.assertEqual(dv.chunk_size(2, 12, 5, chunk=5), 4)  # The largest divisor not above 5.
    self.assertEqual(dv.chunk_size(2, 12, 5, chunk=100), 12)
    self.assertEqual(dv.chunk_size(1, 13, 10**6), 1)  # A prime length: one position per chunk.

  @parameterized.parameters(*FULL)
  def test_chunked_equals_unchunked(self, name):
    zs, zt, mask = _fixture(b=3, t=8, v=11, seed=12)
    hp = {"teacher_temperature": 1.4, **({"beta": 0.3} if name == "jsd" else {})}

    def run(chunk):
      fn = jax.jit(
        jax.value_and_grad(lambda z, t: _call(name, z, t, mask, chunk=chunk, **hp), has_aux=True)
      )
      return fn(zs, zt)

    (v0, m0), g0 = run(0)
    (v1, m1), g1 = run(3)  # T = 8: 4 chunks of 2 positions.
    np.testing.assert_allclose(v1, v0, rtol=1e-6)
    np.testing.assert_allclose(g1, g0, atol=1e-8)
    np.testing.assert_allclose(
      m1["distill/teacher_entropy"], m0["distill/teacher_entropy"], rtol=1e-6
    )
    self.assertGreater(float(jnp.abs(g0).max()), 1e-3)
    if name == "jsd":  # bfloat16 logits: the gradient comes back in bfloat16, to its rounding.
      zs, zt = jnp.asarray(zs, jnp.bfloat16), jnp.asarray(zt, jnp.bfloat16)
      (_, _), g16 = run(3)
      self.assertEqual(g16.dtype, jnp.bfloat16)
      np.testing.assert_allclose(
        np.asarray(g16, np.float32), g0, atol=2e-2 * float(jnp.abs(g0).max())
      )

  def test_auto_threshold_chunks(self):
    """Beyond CHUNK_THRESHOLD the automatic path loops over chunks (a while loop appears)."""
    zs, zt, mask = _fixture(b=2, t=4, v=5, seed=13)

    def has_scan():  # A new function each time: make_jaxpr caches traces per function.
      text = str(jax.make_jaxpr(lambda z, t: _call("forward", z, t, mask)[0])(zs, zt))
      return "scan" in text or "while" in text  # fori_loop lowers to either.

    self.assertFalse(has_scan())
    old = dv.CHUNK_THRESHOLD
    try:
      dv.CHUNK_THRESHOLD = 2 * 5 * 2  # 2·4·5 elements > 20: chunks of 2 positions.
      self.assertTrue(has_scan())
      np.testing.assert_allclose(
        _call("forward", zs, zt, mask)[0], _loss_ref("forward", zs, zt, mask)[0], rtol=1e-5
      )
    finally:
      dv.CHUNK_THRESHOLD = old

  def test_chunked_path_never_builds_a_float32_batch_vocab_array(self):
    """The gradient program of the chunked path holds no float32 array of B·T·V elements outside
    the scan for bfloat16 logits (the unchunked one does: its log-softmax), and, for float32
    logits, its compiled temporaries are a fraction of one float32 [B, T, V] (the unchunked
    path's are at least one)."""
    b, t, v = 4, 32, 512
    rng = np.random.default_rng(14)
    zs, zt = rng.normal(size=(2, b, t, v)).astype(np.float32)
    mask = jnp.ones((b, t), jnp.float32)
    full = b * t * v

    def grad_fn(name, chunk):
      return jax.grad(lambda z, tt: _call(name, z, tt, mask, chunk=chunk)[0])

    def big_f32(name, chunk):
      args = (jnp.asarray(zs, jnp.bfloat16), jnp.asarray(zt, jnp.bfloat16))
      jaxpr = jax.make_jaxpr(grad_fn(name, chunk))(*args).jaxpr
      return [
        o.aval.shape
        for e in jaxpr.eqns
        for o in e.outvars
        if o.aval.dtype == jnp.float32 and np.prod(o.aval.shape) >= full
      ]

    def temp_bytes(name, chunk):
      stats = jax.jit(grad_fn(name, chunk)).lower(zs, zt).compile().memory_analysis()
      return None if stats is None else stats.temp_size_in_bytes

    for name in FULL:
      self.assertNotEqual(big_f32(name, 0), [], name)
      self.assertEqual(big_f32(name, 2), [], name)
    unchunked, chunked = temp_bytes("jsd", 0), temp_bytes("jsd", 2)  # Chunks of [4, 2, 512].
    if unchunked is not None:  # memory_analysis is backend-dependent.
      self.assertGreaterEqual(unchunked, 4 * full)
      self.assertLess(chunked, 4 * full // 4, (chunked, unchunked))
