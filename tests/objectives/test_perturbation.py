"""Rewarded weight perturbations and their consolidation (objectives/perturbation.py; CoRP,
methods_B.md section 4): the section's unit tests, against numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posttrain_jax.objectives import perturbation as pt


def test_population_is_antithetic_seeded_and_has_the_declared_covariance():
  key = jax.random.key(0)
  E = np.asarray(pt.population(key, 6, 5, 0.1))
  np.testing.assert_array_equal(E[0::2], -E[1::2])
  np.testing.assert_array_equal(E, np.asarray(pt.population(key, 6, 5, 0.1)))  # seeds only
  assert not np.allclose(E, np.asarray(pt.population(jax.random.key(1), 6, 5, 0.1)))
  # low rank + floor: covariance sigma^2 (B^T B + floor I), checked by sampling
  B = np.zeros((1, 4), np.float32)
  B[0, 0] = 3.0
  big = np.asarray(pt.population(key, 40000, 4, 0.5, basis=jnp.asarray(B), floor=0.25))
  np.testing.assert_allclose(np.cov(big.T), 0.25 * (B.T @ B + 0.25 * np.eye(4)), atol=0.03)
  with pytest.raises(ValueError, match="even size"):
    pt.population(key, 5, 3, 0.1)


def test_equal_rewards_give_uniform_weights_and_the_gate_rejects_pure_noise():
  E = pt.population(jax.random.key(0), 8, 20, 0.1)
  w = pt.softmax_weights(jnp.full(8, 0.3), beta=0.5, top_k=2)
  np.testing.assert_allclose(np.asarray(w), np.full(8, 1 / 8), rtol=1e-6)
  d, _ = pt.corp(E, jnp.full(8, 0.3), top_k=2)
  np.testing.assert_allclose(np.asarray(d), 0.0, atol=1e-6)  # antithetic pairs cancel
  rng = np.random.default_rng(0)
  base = rng.integers(0, 2, 200).astype(float)  # a candidate that is noise around the base
  noise = np.stack([np.where(rng.random(200) < 0.1, 1 - base, base) for _ in range(3)])
  assert pt.gate(noise, base, seed=0)[0] == -1


def test_top_k_softmax_weights_equal_the_numpy_reference():
  r = np.array([0.1, 0.5, 0.3, 0.9, 0.2, 0.5])
  z = (r - r.mean()) / r.std() / 0.7
  keep = z >= np.sort(z)[-3]
  ref = np.where(keep, np.exp(z - z.max()), 0.0)
  np.testing.assert_allclose(
    np.asarray(pt.softmax_weights(jnp.asarray(r), 0.7, 3)), ref / ref.sum(), rtol=1e-5
  )


def test_with_a_linear_reward_the_direction_aligns_with_its_gradient_as_the_population_grows():
  g = np.asarray(jax.random.normal(jax.random.key(3), (50,)))
  cosines = []
  for n in (16, 256, 4096):
    E = pt.population(jax.random.key(n), n, 50, 0.01)
    d, _ = pt.corp(E, E @ jnp.asarray(g), beta=1.0)
    cosines.append(float(d @ g / (jnp.linalg.norm(d) * np.linalg.norm(g))))
  assert cosines[0] < cosines[1] < cosines[2] and cosines[2] > 0.95, cosines


def test_es_direction_is_in_expectation_the_smoothed_gradient_of_a_quadratic():
  """f(x) = -0.5 (x - m)^T A (x - m): with antithetic pairs, sum_i f(x + eps_i) eps_i / N has
  expectation sigma^2 grad f(x) (the Gaussian-smoothed gradient; the Hessian term cancels)."""
  rng = np.random.default_rng(0)
  dim, sigma, n = 4, 0.05, 200_000
  Q = rng.normal(size=(dim, dim))
  A, m, x = Q @ Q.T + np.eye(dim), rng.normal(size=dim), rng.normal(size=dim)
  E = np.asarray(pt.population(jax.random.key(7), n, dim, sigma), np.float64)
  y = x + E - m
  f = -0.5 * np.einsum("ni,ij,nj->n", y, A, y)
  estimate = (f[:, None] * E).mean(axis=0) / sigma**2
  np.testing.assert_allclose(estimate, -A @ (x - m), rtol=0.02, atol=0.02)
  # the library's es rule is this estimate with standardised rewards: the same direction
  d, _ = pt.es(jnp.asarray(E, jnp.float32), jnp.asarray(f, jnp.float32))
  cos = float(np.asarray(d) @ estimate / (np.linalg.norm(d) * np.linalg.norm(estimate)))
  assert cos > 0.999


def test_the_gate_never_accepts_a_candidate_below_the_base():
  rng = np.random.default_rng(1)
  for trial in range(200):
    m = int(rng.integers(5, 60))
    base = rng.integers(0, 2, m).astype(float)
    cands = rng.integers(0, 2, (int(rng.integers(1, 4)), m)).astype(float)
    best, lower = pt.gate(cands, base, seed=trial)
    if best >= 0:
      assert cands[best].mean() > base.mean() and lower > 0
  # a clearly better candidate is accepted
  base = np.zeros(100)
  better = np.stack([np.zeros(100), (rng.random(100) < 0.4).astype(float)])
  assert pt.gate(better, base)[0] == 1


@pytest.mark.parametrize("rule", sorted(pt.CONSOLIDATIONS))
def test_every_rule_is_invariant_to_permuting_the_population_and_jits(rule):
  E = pt.population(jax.random.key(0), 16, 30, 0.1)
  r = jax.random.uniform(jax.random.key(1), (16,))
  perm = jax.random.permutation(jax.random.key(2), 16)
  fn = pt.CONSOLIDATIONS[rule]
  d, _ = fn(E, r)
  np.testing.assert_allclose(np.asarray(fn(E[perm], r[perm])[0]), np.asarray(d), atol=1e-6)
  np.testing.assert_allclose(np.asarray(jax.jit(fn)(E, r)[0]), np.asarray(d), atol=1e-6)


def test_randopt_is_the_best_perturbation_and_reward_mean_skips_the_reweighting():
  E = pt.population(jax.random.key(0), 8, 10, 0.1)
  r = jnp.array([0.1, 0.7, 0.2, 0.3, 0.1, 0.0, 0.4, 0.2])
  np.testing.assert_array_equal(np.asarray(pt.randopt(E, r)[0]), np.asarray(E[1]))
  w = pt.softmax_weights(r)
  np.testing.assert_allclose(np.asarray(pt.reward_mean(E, r)[0]), np.asarray(w @ E), rtol=1e-6)


def test_compatibility_weights_equal_a_numpy_loop():
  E = np.asarray(pt.population(jax.random.key(4), 10, 6, 0.3), np.float64)
  w = np.asarray(pt.softmax_weights(jax.random.uniform(jax.random.key(5), (10,))), np.float64)
  d = w @ E
  c = d / w.sum()
  ref = np.array(
    [
      w[i]
      * max(E[i] @ d / (np.linalg.norm(E[i]) * np.linalg.norm(d)), 0)
      / np.linalg.norm(E[i] - c)
      for i in range(10)
    ]
  )
  got = np.asarray(
    pt.compatibility_weights(jnp.asarray(E, jnp.float32), jnp.asarray(w, jnp.float32))
  )
  np.testing.assert_allclose(got, ref / ref.sum(), rtol=1e-4)


def test_split_half_overlap_finds_a_planted_low_rank_reward_and_not_noise():
  dim, n, r = 50, 2000, 1
  E = pt.population(jax.random.key(0), n, dim, 1.0)
  planted = jnp.zeros((dim,)).at[:2].set(1.0)  # the reward grows along one direction only
  overlap, baseline = pt.subspace_overlap(E, (E @ planted) ** 2 * jnp.sign(E @ planted), r)
  noise = [
    pt.subspace_overlap(E, jax.random.uniform(jax.random.key(s), (n,)), r)[0] for s in range(5)
  ]
  assert baseline == r / dim and overlap > 10 * baseline and overlap > 4 * max(noise)
