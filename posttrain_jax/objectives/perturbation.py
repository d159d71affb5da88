"""Gradient-free search in weight space: rewarded perturbations and their consolidation into one
update (CoRP, methods_B.md section 4; RandOpt's best-of-population and the ES mean as rules).

A population is a matrix ``E`` [N, D] of flattened perturbations (rows eps_i), drawn in
antithetic pairs from seeds (:func:`population`), so that processes exchange seeds and rewards
only. A consolidation rule maps (E, rewards) to one direction d [D] in
:data:`CONSOLIDATIONS`; the stage then tries ``theta + alpha d`` on a grid of alphas and keeps
the best only if the validation gate (:func:`gate`) accepts it.

CoRP's weights, compatibility reweighting, dispersion and gate are derived (the abstract and a
methodology summary name them, not their formulas); each is one function here, easy to change.
"""

import jax
import jax.numpy as jnp
import numpy as np


def population(key: jax.Array, n: int, dim: int, sigma: float, basis=None, floor: float = 1.0):
  """E [n, dim]: n perturbations in antithetic pairs (row 2j = +sigma z_j, row 2j+1 = -sigma
  z_j), z_j drawn from ``fold_in(key, j)``. ``basis`` [r, dim] (orthonormal rows; None:
  isotropic): z = basis^T a + sqrt(floor) u with a ~ N(0, I_r), u ~ N(0, I_dim), i.e. the
  covariance ``basis^T basis + floor I`` (derived: CoRP's low-rank plus isotropic floor)."""
  if n % 2:
    raise ValueError(f"a population of antithetic pairs needs an even size, got {n}")

  def draw(j):
    k = jax.random.fold_in(key, j)
    z = jax.random.normal(k, (dim,))
    if basis is not None:
      a = jax.random.normal(jax.random.fold_in(k, 1), (basis.shape[0],))
      z = basis.T @ a + jnp.sqrt(floor) * z
    return sigma * z

  z = jax.vmap(draw)(jnp.arange(n // 2))
  return jnp.stack([z, -z], axis=1).reshape(n, dim)


def standardize(rewards: jax.Array) -> jax.Array:
  """(R - mean) / std; all zeros when every reward is equal."""
  std = jnp.std(rewards)
  return jnp.where(std > 0, (rewards - jnp.mean(rewards)) / jnp.where(std > 0, std, 1.0), 0.0)


def softmax_weights(rewards: jax.Array, beta: float = 1.0, top_k: int = 0) -> jax.Array:
  """softmax(R~ / beta) over the ``top_k`` best (0: all), zero elsewhere; uniform over the whole
  population when every reward is equal (derived: CoRP's reward-weighted aggregation)."""
  z = standardize(rewards) / beta
  if top_k and top_k < rewards.shape[0]:
    kth = jnp.sort(z)[-top_k]
    keep = (z >= kth) & (jnp.std(rewards) > 0)
    z = jnp.where(keep | (jnp.std(rewards) == 0), z, -jnp.inf)
  return jax.nn.softmax(z)


def compatibility_weights(E: jax.Array, w: jax.Array, eps: float = 1e-12) -> jax.Array:
  """CoRP's reweighting (derived): w'_i ∝ w_i max(cos(eps_i, d), 0) / ||eps_i - c||, with
  d = sum_i w_i eps_i and c the w-weighted centroid (which is d / sum w); normalised to sum 1
  (back to ``w`` normalised when no perturbation is compatible)."""
  d = w @ E
  cos = (E @ d) / (jnp.linalg.norm(E, axis=1) * jnp.linalg.norm(d) + eps)
  centroid = d / jnp.maximum(jnp.sum(w), eps)
  dispersion = jnp.linalg.norm(E - centroid, axis=1) + eps
  raw = w * jnp.maximum(cos, 0.0) / dispersion
  total = jnp.sum(raw)
  return jnp.where(
    total > 0, raw / jnp.where(total > 0, total, 1.0), w / jnp.maximum(jnp.sum(w), eps)
  )


def corp(E: jax.Array, rewards: jax.Array, *, beta: float = 1.0, top_k: int = 0):
  """CoRP: softmax reward weights, then compatibility reweighting; d' = sum w'_i eps_i."""
  w = compatibility_weights(E, softmax_weights(rewards, beta, top_k))
  return w @ E, {"search/weight_max": jnp.max(w), "search/weights_used": jnp.sum(w > 1e-6)}


def reward_mean(E: jax.Array, rewards: jax.Array, *, beta: float = 1.0, top_k: int = 0):
  """The plain reward-weighted mean (softmax weights without CoRP's reweighting)."""
  w = softmax_weights(rewards, beta, top_k)
  return w @ E, {"search/weight_max": jnp.max(w), "search/weights_used": jnp.sum(w > 1e-6)}


def randopt(E: jax.Array, rewards: jax.Array):
  """RandOpt's single-model answer: the best perturbation itself (the first of tied ones)."""
  i = jnp.argmax(rewards)
  return E[i], {"search/weight_max": jnp.float32(1.0), "search/weights_used": jnp.float32(1.0)}


def es(E: jax.Array, rewards: jax.Array):
  """Evolution strategies' estimate: sum_i R~_i eps_i / N, whose expectation (unstandardised,
  antithetic) is sigma^2 times the gradient of the Gaussian-smoothed reward."""
  w = standardize(rewards) / rewards.shape[0]
  return w @ E, {"search/weight_max": jnp.max(jnp.abs(w)), "search/weights_used": jnp.sum(w != 0)}


CONSOLIDATIONS = {"corp": corp, "reward_mean": reward_mean, "randopt": randopt, "es": es}


def gate(
  candidates: np.ndarray,
  base: np.ndarray,
  *,
  margin: float = 0.0,
  boots: int = 1000,
  seed: int = 0,
  level: float = 0.05,
):
  """The validation gate (derived): the candidate (row of ``candidates`` [A, M], per-problem
  validation scores; ``base`` [M] those of theta_0) with the best mean is accepted when the
  ``level`` quantile of the bootstrap distribution (over problems, paired) of its mean
  difference to the base exceeds ``margin``. Returns (accepted row or -1, that lower bound)."""
  candidates, base = np.asarray(candidates, np.float64), np.asarray(base, np.float64)
  best = int(np.argmax(candidates.mean(axis=1)))
  diff = candidates[best] - base
  rng = np.random.default_rng(seed)
  means = diff[rng.integers(0, len(diff), size=(boots, len(diff)))].mean(axis=1)
  lower = float(np.quantile(means, level))
  return (best if lower > margin and diff.mean() > 0 else -1), lower


def top_directions(E: jax.Array, weights: jax.Array, r: int) -> jax.Array:
  """The top-``r`` right singular vectors [r, D] of diag(sqrt(w)) E, w = max(weights, 0): the
  subspace the rewarded perturbations span (through the N x N Gram matrix)."""
  M = jnp.sqrt(jnp.maximum(weights, 0.0))[:, None] * E
  vals, vecs = jnp.linalg.eigh(M @ M.T)  # ascending
  vals, vecs = vals[::-1][:r], vecs[:, ::-1][:, :r]
  V = (M.T @ vecs) / jnp.sqrt(jnp.maximum(vals, 1e-30))
  return V.T


def subspace_overlap(E: jax.Array, rewards: jax.Array, r: int) -> tuple[float, float]:
  """CoRP's split-half diagnostic: the population halved (pairs kept whole), each half's top-r
  rewarded subspace (:func:`top_directions` of its positive standardised rewards), and
  ||P_1 P_2||_F^2 / r (1: the same subspace) beside the random-subspace baseline r / D."""
  n = E.shape[0] // 4 * 2
  halves = [(E[:n], rewards[:n]), (E[n : 2 * n], rewards[n : 2 * n])]
  V1, V2 = (top_directions(e, jnp.maximum(standardize(x), 0.0), r) for e, x in halves)
  return float(jnp.sum((V1 @ V2.T) ** 2) / r), r / E.shape[1]
