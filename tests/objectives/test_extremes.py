"""Edge cases a user from verl meets first (issue 36): policy losses at extreme log-ratios stay
finite in value and gradient, every registry adapter passes on every keyword of its function,
and whitening with ``eps = 0`` gives size-1 and all-equal groups exactly zero advantage."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posttrain_jax import objectives
from posttrain_jax.objectives import ppo_family, registries

B, T = 4, 5
RATIO_LOSSES = (
  "ppo_clip",
  "gspo",
  "gmpo",
  "luspo",
  "vespo",
  "sapo",
  "cispo",
  "hpo",
  "a_hpo",
  "clip_cov",
  "kl_cov",
)


def _inputs(log_ratio: float, sign: float):
  """Rows whose first token has the given log-ratio and whose advantages have ``sign``."""
  key = jax.random.key(0)
  old = -jax.random.uniform(key, (B, T), minval=0.5, maxval=2.0)
  shift = jnp.zeros((B, T)).at[:, 0].set(log_ratio)
  mask = jnp.ones((B, T)).at[1, 3:].set(0.0)
  adv = sign * jnp.asarray([1.0, 0.5, 2.0, 0.25])
  return old + shift, old, adv, mask


def _kwargs(name):
  return {"dual_clip": 3.0} if name == "ppo_clip" else {}


@pytest.mark.parametrize("name", RATIO_LOSSES)
@pytest.mark.parametrize("log_ratio", [25.0, 100.0, -100.0])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_extreme_log_ratios_give_finite_losses_and_gradients(name, log_ratio, sign):
  logprobs, old, adv, mask = _inputs(log_ratio, sign)
  fn = objectives.POLICY_LOSSES[name]
  for kwargs in ({}, _kwargs(name)):
    loss = lambda lp: fn(lp, old, adv, mask, **kwargs)[0]
    value, grad = jax.value_and_grad(loss)(logprobs)
    assert np.isfinite(float(value)), (name, log_ratio, sign, kwargs)
    assert np.all(np.isfinite(np.asarray(grad))), (name, log_ratio, sign, kwargs)
    _, metrics = fn(logprobs, old, adv, mask, **kwargs)
    assert all(np.isfinite(float(v)) for v in metrics.values()), metrics


def test_the_clamp_changes_nothing_inside_its_bounds_and_holds_the_ratio_beyond():
  logprobs, old, adv, mask = _inputs(3.0, 1.0)
  fn = objectives.POLICY_LOSSES["ppo_clip"]
  got, _ = fn(logprobs, old, adv, mask)
  ratio = np.exp(np.asarray(logprobs - old, np.float64))  # no clamp needed at log-ratio 3
  a = np.asarray(adv, np.float64)[:, None]
  m = np.asarray(mask, np.float64)
  token = np.maximum(-ratio * a, -np.clip(ratio, 0.8, 1.2) * a)
  np.testing.assert_allclose(float(got), (token * m).sum() / m.sum(), rtol=1e-5)
  # beyond the bound a larger log-ratio changes nothing: the ratio is exp(LIMIT)
  limit = ppo_family.LOG_RATIO_LIMIT
  at = [fn(*_inputs(x, -1.0))[0] for x in (limit + 5.0, limit + 50.0)]
  assert float(at[0]) == float(at[1])
  grad = jax.grad(lambda lp: fn(lp, old, -adv, mask)[0])(_inputs(limit + 5.0, -1.0)[0])
  assert float(jnp.abs(grad[:, 0]).max()) == 0.0  # no gradient through the clamped token


def _keyword_only(fn) -> set:
  params = inspect.signature(fn).parameters.values()
  return {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _accepts_any(fn) -> bool:
  params = inspect.signature(fn).parameters.values()
  return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def test_every_adapter_passes_on_every_keyword_of_its_function():
  checked = []
  for kind in registries.SOURCES:
    for name, entry in getattr(registries, kind).items():
      target = getattr(entry, "adapts", None)
      if target is None or _accepts_any(entry):
        continue
      missing = _keyword_only(target) - _keyword_only(entry) - entry.fills
      assert not missing, f"{kind}[{name!r}] drops {sorted(missing)} of {target.__name__}"
      checked.append(name)
  # every adapter over AdvantageInputs declares its function
  adapters = [n for n, e in objectives.ADVANTAGES.items() if e.__name__.startswith("_")]
  assert set(adapters) <= set(checked) and "reinforce_pp_token" in checked


def test_reinforce_pp_token_takes_gamma_from_the_config():
  rewards = jnp.asarray([[0.0, 0.0, 1.0, 0.0], [0.0, 0.5, 0.0, 1.0]], jnp.float32)
  mask = jnp.asarray([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]], jnp.float32)
  inputs = objectives.AdvantageInputs(
    rewards=jnp.zeros(2),
    group=jnp.zeros(2, jnp.int32),
    valid=jnp.ones(2),
    mask=mask,
    token_rewards=rewards,
  )
  entry = objectives.ADVANTAGES["reinforce_pp_token"]
  got, _ = entry(inputs, num_groups=1, gamma=0.9)
  returns = np.zeros((2, 4))
  for b in range(2):
    g = 0.0
    for t in reversed(range(4)):
      g = (float(rewards[b, t]) if mask[b, t] else 0.0) + 0.9 * g
      returns[b, t] = g
  on = np.asarray(mask) > 0
  want = (returns - returns[on].mean()) / (returns[on].std() + 1e-8)
  np.testing.assert_allclose(np.asarray(got)[on], want[on], rtol=1e-5, atol=1e-6)
  plain, _ = entry(inputs, num_groups=1)
  assert not np.allclose(np.asarray(plain), np.asarray(got))  # gamma reached the function


def _rows(rewards, group):
  r = jnp.asarray(rewards, jnp.float32)
  return objectives.AdvantageInputs(
    rewards=r, group=jnp.asarray(group, jnp.int32), valid=jnp.ones_like(r), mask=None
  )


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "reinforce_pp", "reinforce_pp_baseline"])
def test_eps_zero_gives_flat_and_single_row_groups_exactly_zero(name):
  # group 0: all equal (7.3, the value whose float32 mean is one rounding step off); group 1: a
  # single row; group 2: a real spread
  inputs = _rows([7.3, 7.3, 7.3, 4.0, 1.0, 3.0], [0, 0, 0, 1, 2, 2])
  adv, _ = objectives.ADVANTAGES[name](inputs, num_groups=3, eps=0.0)
  adv = np.asarray(adv)
  assert np.all(np.isfinite(adv)), adv
  if name in ("grpo", "dr_grpo", "reinforce_pp_baseline"):
    assert np.all(adv[:4] == 0.0), adv
    assert adv[4] < 0 < adv[5]
  flat, _ = objectives.ADVANTAGES[name](_rows([2.5] * 4, [0, 0, 1, 1]), num_groups=2, eps=0.0)
  assert np.all(np.asarray(flat) == 0.0)


def test_gndpo_with_eps_zero_on_a_flat_batch_is_zero():
  lp = jnp.full((2, 3), -1.0)
  inputs = objectives.AdvantageInputs(
    rewards=jnp.zeros(2),
    group=jnp.zeros(2, jnp.int32),
    valid=jnp.ones(2),
    mask=jnp.ones((2, 3)),
    logprobs=lp,
    teacher_logprobs=lp - 0.5,
  )
  adv, _ = objectives.ADVANTAGES["gndpo"](inputs, num_groups=1, eps=0.0)
  assert np.all(np.asarray(adv) == 0.0)
