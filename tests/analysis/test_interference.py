"""The second-order damage prediction (analysis/interference.py) on quadratic toys, where it is
exact, and on a tiny decoder, where it tracks the measured change for small updates; the
refresh contraction (I - eta H)^s and the conflict rollback of methods_A.md section 14."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from posttrain_jax import models
from posttrain_jax.analysis import interference, plasticity
from posttrain_jax.modelops import anchored

RNG = np.random.default_rng(0)
M = RNG.normal(size=(6, 6))
H = jnp.asarray(M @ M.T + np.eye(6), jnp.float32)  # positive definite
C = jnp.asarray(RNG.normal(size=6), jnp.float32)


def quad(params):
  x = params["x"] - C
  return 0.5 * x @ H @ x + params["y"] ** 3 * 0.0


def test_the_prediction_is_exact_on_a_quadratic_and_first_order_vanishes_at_the_optimum():
  theta_a = {"x": C, "y": jnp.float32(0.0)}  # the optimum of L_A
  theta_b = {"x": C + jnp.asarray(RNG.normal(size=6), jnp.float32), "y": jnp.float32(1.0)}
  d = interference.damage(quad, theta_a, theta_b)
  assert d["first_order"] == pytest.approx(0.0, abs=1e-6)
  assert d["second_order"] == pytest.approx(d["measured"], rel=1e-5)
  off = {"x": C + 0.3, "y": jnp.float32(0.0)}  # away from the optimum: both terms, still exact
  d2 = interference.damage(quad, off, theta_b)
  assert abs(d2["first_order"]) > 1e-3 and d2["predicted"] == pytest.approx(
    d2["measured"], rel=1e-5
  )
  v = {"x": jnp.ones(6), "y": jnp.float32(0.0)}
  np.testing.assert_allclose(
    np.asarray(interference.hvp(quad, theta_a, v)["x"]), H @ jnp.ones(6), rtol=1e-5
  )


def test_the_refresh_contracts_the_harmful_component_as_i_minus_eta_h_to_the_s():
  """Gradient descent on L_A for s steps from theta_A + D leaves (I - eta H)^s D."""
  eta, s = 0.02, 7
  start = C + jnp.asarray(RNG.normal(size=6), jnp.float32)
  opt = optax.sgd(eta)
  params, state = {"x": start, "y": jnp.float32(0.0)}, None
  state = opt.init(params)
  for _ in range(s):
    g = jax.grad(quad)(params)
    upd, state = opt.update(g, state)
    params = optax.apply_updates(params, upd)
  want = np.linalg.matrix_power(np.eye(6) - eta * np.asarray(H, np.float64), s) @ np.asarray(
    start - C
  )
  np.testing.assert_allclose(np.asarray(params["x"] - C), want, rtol=1e-4, atol=1e-6)


def test_on_a_decoder_the_prediction_tracks_the_measured_change_for_small_updates():
  graphdef, params = nnx.split(
    models.Decoder(models.preset("nano", vocab_size=17), rngs=nnx.Rngs(0))
  )
  # its own generator: the tokens do not depend on which tests ran before in this process
  tokens = jnp.asarray(np.random.default_rng(0).integers(2, 17, (4, 9)), jnp.int32)
  mask = jnp.ones((4, 9), jnp.float32)
  loss = lambda p: plasticity.nll(graphdef, p, tokens, mask)  # noqa: E731
  _, noise = nnx.split(models.Decoder(models.preset("nano", vocab_size=17), rngs=nnx.Rngs(1)))
  # the measured change is a difference of two float32 losses: a few ULPs of the loss is noise
  noise_floor = 8 * float(np.spacing(np.float32(loss(params))))
  for scale in (5e-3, 1e-2):
    moved = jax.tree.map(lambda a, n: a + scale * n, params, noise)
    d = interference.damage(loss, params, moved)
    first_only = abs(d["first_order"] - d["measured"])
    assert first_only > 4 * noise_floor  # the second-order term is visible at this scale
    assert abs(d["predicted"] - d["measured"]) < 0.5 * first_only + noise_floor  # it helps


def test_conflict_rollback_picks_opposed_moves_and_full_rollback_gives_theta_a():
  theta_0 = {"w": jnp.zeros(6)}
  theta_a = {"w": jnp.asarray([1.0, 1.0, -1.0, 2.0, 0.5, 0.0])}
  theta_b = {"w": jnp.asarray([0.0, 2.0, 0.0, 1.9, 0.6, 1.0])}
  # opposed: index 0 (|dB| 1 * |dA| 1), 2 (1 * 1), 3 (0.1 * 2); same sign: 1, 4; dA = 0: 5
  got = anchored.rollback([theta_b, theta_a, theta_0], fraction=3 / 6, score="conflict")
  np.testing.assert_array_equal(np.asarray(got["w"]), np.float32([1.0, 2.0, -1.0, 2.0, 0.6, 1.0]))
  full = anchored.rollback([theta_b, theta_a, theta_0], fraction=1.0, score="conflict")
  np.testing.assert_array_equal(np.asarray(full["w"]), np.asarray(theta_a["w"]))
  with pytest.raises(ValueError, match="needs three trees"):
    anchored.rollback([theta_b, theta_a], fraction=0.5, score="conflict")
