"""Reward shaping terms of objectives/shaping.py called directly (the ``overlong`` term through
the batch is tested in tests/train/test_inputs.py): ``length_bonus``, CGTR's length exploit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posttrain_jax import objectives
from posttrain_jax.objectives import shaping

L_MAX = 16


def _inputs(lengths):
  lengths = np.asarray(lengths, np.int32)
  return objectives.ShapingInputs(jnp.asarray(lengths), jnp.zeros(lengths.shape, bool), L_MAX)


@pytest.mark.parametrize("coef,only_correct", [(0.1, False), (0.3, True), (-0.2, False)])
def test_length_bonus_against_numpy(coef, only_correct):
  rng = np.random.default_rng(0)
  lengths = rng.integers(1, L_MAX + 1, 12)
  rewards = rng.choice([0.0, 1.0, -0.5, 0.25], 12).astype(np.float32)
  got, keep, metrics = objectives.SHAPINGS["length_bonus"](
    jnp.asarray(rewards), _inputs(lengths), coef=coef, only_correct=only_correct
  )
  bonus = coef * lengths / L_MAX
  if only_correct:
    bonus = bonus * (rewards > 0)
  np.testing.assert_allclose(np.asarray(got), rewards + bonus, rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(np.asarray(keep), 1.0)
  assert float(metrics["shaping/length_bonus"]) == pytest.approx(bonus.mean(), rel=1e-5)


def test_length_bonus_defaults_make_longer_completions_earn_more_in_every_group():
  """Default coef 0.1 on all rows: within a group of equal verifier rewards the longest
  completion gets the highest shaped reward (the exploit), a full-budget one exactly +0.1."""
  lengths = np.array([2, 8, 16, 4])
  got, _, _ = shaping.length_bonus(jnp.zeros(4), _inputs(lengths))
  assert np.argmax(np.asarray(got)) == 2 and float(got[2]) == pytest.approx(0.1)
  assert list(np.argsort(np.asarray(got))) == list(np.argsort(lengths))


def test_length_bonus_jits_and_validates_its_inputs():
  fn = jax.jit(lambda r, n: shaping.length_bonus(r, _inputs_traced(n), coef=0.5)[0])
  np.testing.assert_allclose(
    np.asarray(fn(jnp.ones(3), jnp.asarray([4, 8, 16]))), [1.125, 1.25, 1.5], rtol=1e-6
  )
  with pytest.raises(ValueError, match="max_length >= 1"):
    shaping.length_bonus(
      jnp.zeros(2), objectives.ShapingInputs(jnp.ones(2, jnp.int32), jnp.zeros(2, bool), 0)
    )
  with pytest.raises(AssertionError):
    shaping.length_bonus(jnp.zeros(3), _inputs([1, 2]))


def _inputs_traced(lengths):
  return objectives.ShapingInputs(lengths, jnp.zeros(lengths.shape, bool), L_MAX)


def test_self_certainty_is_the_masked_mean_log_prob():
  rng = np.random.default_rng(0)
  logprobs = -rng.exponential(size=(3, 5)).astype(np.float32)
  mask = np.asarray([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], np.float32)
  inputs = objectives.ShapingInputs(
    jnp.asarray(mask.sum(1), jnp.int32),
    jnp.zeros(3, bool),
    L_MAX,
    jnp.asarray(logprobs),
    jnp.asarray(mask),
  )
  rewards = jnp.asarray([1.0, 0.0, 0.5])
  out, keep, metrics = shaping.self_certainty(rewards, inputs, coef=0.5)
  expected = [
    r + 0.5 * np.mean([logprobs[i, t] for t in range(5) if mask[i, t]])
    for i, r in enumerate([1.0, 0.0, 0.5])
  ]
  np.testing.assert_allclose(out, expected, rtol=1e-6)
  np.testing.assert_array_equal(keep, 1.0)
  # Log-probs under the mask's zeros do not count.
  moved = inputs._replace(logprobs=jnp.asarray(np.where(mask > 0, logprobs, -99.0)))
  np.testing.assert_allclose(shaping.self_certainty(rewards, moved, coef=0.5)[0], out)
  with pytest.raises(ValueError, match="log-probs"):
    shaping.self_certainty(rewards, inputs._replace(logprobs=None))


def test_cme_is_the_verifiers_masked_mean_log_prob_and_reads_the_teacher():
  rng = np.random.default_rng(1)
  teacher = -rng.exponential(size=(2, 4)).astype(np.float32)
  mask = np.asarray([[1, 1, 0, 0], [1, 1, 1, 1]], np.float32)
  inputs = objectives.ShapingInputs(
    jnp.asarray(mask.sum(1), jnp.int32),
    jnp.zeros(2, bool),
    L_MAX,
    jnp.zeros((2, 4)),
    jnp.asarray(mask),
    jnp.asarray(teacher),
  )
  out, _, metrics = shaping.cme(jnp.zeros(2), inputs, coef=2.0)
  expected = [2.0 * teacher[0, :2].mean(), 2.0 * teacher[1].mean()]
  np.testing.assert_allclose(out, expected, rtol=1e-6)
  assert (np.asarray(out) <= 0).all()  # a log-likelihood: r <= 0 for coef > 0
  # Not the generator's own log-probs (self_certainty reads those: here all 0).
  np.testing.assert_allclose(shaping.self_certainty(jnp.zeros(2), inputs)[0], 0.0)
  assert "teacher_logprobs" in objectives.SHAPINGS["cme"].reads
  with pytest.raises(ValueError, match="verifier"):
    shaping.cme(jnp.zeros(2), inputs._replace(teacher_logprobs=None))
