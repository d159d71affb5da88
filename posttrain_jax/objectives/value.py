"""GAE with a learned critic (the ``gae`` advantage) and the PPO value loss.

Shapes: ``B`` sequences, ``T`` completion tokens. :data:`ADVANTAGES` holds the ``gae`` adapter
over :class:`~posttrain_jax.objectives.advantage_inputs.AdvantageInputs`; :data:`VALUE_LOSSES`
holds the critic losses that go with it::

    fn(values [B, T], old_values [B, T], returns [B, T], mask [B, T], *, clip_eps, ...)
        -> (loss, metrics)
"""

from typing import Callable

import chex
import jax
import jax.numpy as jnp

from posttrain_jax.objectives.advantage_inputs import (
  _check_tokens,
  _require,
  _row_metrics,
  _token_mask,
)
from posttrain_jax.objectives.reductions import (
  WHITENINGS,
  aggregate,
  masked_mean,
  masked_var,
  masked_whiten,
)
from posttrain_jax.registry import adapts, choices, reads

sg = jax.lax.stop_gradient


def gae_advantages(
  rewards: jax.Array, values: jax.Array, mask: jax.Array, *, gamma: float = 1.0, lam: float = 0.95
):
  """Generalised advantage estimation (Schulman et al. 2016, eq. 16) over completion tokens.

      δ_t = r_t + γ V_{t'} - V_t,    A_t = δ_t + γλ A_{t'},    R_t = A_t + V_t

  where ``t'`` is the next token with ``mask = 1`` (masked tokens, e.g. tool observations, are
  skipped as in verl) and ``V, A`` after the last token are 0. A reverse ``lax.scan`` over T.

  Args:
    rewards: [B, T] float32 per-token rewards (a sparse terminal reward sits on the last token).
    values: [B, T] float32 critic values V_t (stop-gradient inside).
    mask: [B, T] float32 completion mask.
    gamma: discount γ.
    lam: GAE λ.

  Returns:
    (advantages [B, T], returns [B, T]), both 0 where ``mask = 0`` and both stop-gradient.
  """
  _check_tokens(rewards, values, mask)
  on = mask > 0
  r = jnp.where(on, sg(rewards), 0.0)
  v = jnp.where(on, sg(values), 0.0)

  def step(carry, xs):
    next_value, next_adv = carry
    r_t, v_t, on_t = xs
    adv_t = r_t + gamma * next_value - v_t + gamma * lam * next_adv
    carry = (jnp.where(on_t, v_t, next_value), jnp.where(on_t, adv_t, next_adv))
    return carry, adv_t

  zeros = jnp.zeros(r.shape[:1], jnp.float32)
  _, adv = jax.lax.scan(step, (zeros, zeros), (r.T, v.T, on.T), reverse=True)
  adv = jnp.where(on, adv.T, 0.0)
  returns = jnp.where(on, adv + v, 0.0)
  return adv, returns


def terminal_rewards(rewards: jax.Array, mask: jax.Array) -> jax.Array:
  """[B] sequence rewards -> [B, T] with each reward on the last token where ``mask = 1``."""
  chex.assert_rank([rewards, mask], [1, 2])
  on = mask > 0
  last = mask.shape[1] - 1 - jnp.argmax(on[:, ::-1], axis=1)
  hot = jax.nn.one_hot(last, mask.shape[1], dtype=jnp.float32) * jnp.any(on, axis=1)[:, None]
  return hot * rewards[:, None]


def gae(
  rewards: jax.Array,
  values: jax.Array,
  mask: jax.Array,
  *,
  gamma: float = 1.0,
  lam: float = 0.95,
  whiten: bool = True,
  whitening: str = "population",
):
  """PPO token advantages: :func:`gae_advantages` with the sequence reward on the last token.

  Args:
    rewards: [B] float32 sequence rewards (0 for padding rows).
    values: [B, T] float32 critic values.
    mask: [B, T] float32 completion mask (all 0 on padding rows).
    gamma, lam: GAE γ and λ.
    whiten: whiten the advantages over all masked tokens of the batch (returns are not).
    whitening: its convention, ``"population"`` or ``"unbiased"`` (verl's;
      ``reductions.masked_whiten``).

  Returns:
    ([B, T] advantages, metrics with ``gae/returns_mean`` and ``gae/values_mean``).
  """
  chex.assert_rank([rewards, values, mask], [1, 2, 2])
  return gae_tokens(
    terminal_rewards(rewards, mask),
    values,
    mask,
    gamma=gamma,
    lam=lam,
    whiten=whiten,
    whitening=whitening,
  )


def gae_tokens(
  rewards: jax.Array,
  values: jax.Array,
  mask: jax.Array,
  *,
  gamma: float = 1.0,
  lam: float = 0.95,
  whiten: bool = True,
  whitening: str = "population",
):
  """:func:`gae` on per-token rewards ``[B, T]`` (e.g. a terminal reward minus a per-token KL
  penalty). Returns ([B, T] advantages, metrics)."""
  adv, returns = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
  metrics = {f"gae/raw_{k[4:]}": v for k, v in _row_metrics(adv, mask).items()}
  if whiten:
    adv = masked_whiten(adv, mask, whitening=whitening)
  metrics.update(_row_metrics(adv, mask))
  metrics["gae/returns_mean"] = masked_mean(returns, mask)
  metrics["gae/values_mean"] = masked_mean(jnp.where(mask > 0, values, 0.0), mask)
  return adv, metrics


def clipped_mse(
  values: jax.Array,
  old_values: jax.Array,
  returns: jax.Array,
  mask: jax.Array,
  *,
  clip_eps: float = 0.2,
  aggregation: str = "token_mean",
  norm_length=None,
):
  """PPO clipped value loss (Schulman et al. 2017; the form of the OpenAI baselines / verl).

      V^clip_t = clip(V_t, V^old_t - ε, V^old_t + ε)
      ℓ_t = ½ max((V_t - R_t)², (V^clip_t - R_t)²)

  Args:
    values: [B, T] float32 current critic values (differentiated).
    old_values: [B, T] float32 critic values at rollout time (stop-gradient).
    returns: [B, T] float32 targets R_t, e.g. from :func:`gae_advantages` (stop-gradient).
    mask: [B, T] float32 completion mask.
    clip_eps: ε.
    aggregation: a name in reductions.AGGREGATIONS (default: token mean).
    norm_length: constant length for ``seq_mean_token_sum_norm``.

  Returns:
    (scalar loss, metrics with ``loss/vf_num`` and ``loss/vf_den`` for exact micro-batching).
  """
  _check_tokens(values, old_values, returns, mask)
  on = mask > 0
  v = jnp.where(on, values, 0.0)
  v_old = jnp.where(on, sg(old_values), 0.0)
  target = jnp.where(on, sg(returns), 0.0)
  v_clip = v_old + jnp.clip(v - v_old, -clip_eps, clip_eps)
  err, err_clip = jnp.square(v - target), jnp.square(v_clip - target)
  token_loss = 0.5 * jnp.maximum(err, err_clip)
  agg = aggregate(token_loss, mask, mode=aggregation, norm_length=norm_length)
  resid_var = masked_var(target - v, mask)
  metrics = {
    "loss/vf": agg.value,
    "loss/vf_num": agg.numerator,
    "loss/vf_den": agg.denominator,
    "vf/clip_frac": masked_mean((err_clip > err).astype(jnp.float32), mask),
    "vf/explained_var": 1.0 - resid_var / jnp.maximum(masked_var(target, mask), 1e-8),
  }
  return agg.value, metrics


# ---------------------------------------------------------------------------------------------
# Registry adapter.


@reads("values", "token_rewards")
@choices(whitening=WHITENINGS)
@adapts(gae_tokens)
def _gae_entry(inputs, *, num_groups, gamma=1.0, lam=0.95, whiten=True, whitening="population"):
  del num_groups
  values = _require(inputs, "values", "gae", "[B, T] critic values")
  mask = _token_mask(inputs, "gae")
  if inputs.token_rewards is None:  # the sequence reward on the last token
    rewards = terminal_rewards(jnp.where(inputs.valid > 0, inputs.rewards, 0.0), mask)
  else:
    rewards = jnp.where(mask > 0, inputs.token_rewards, 0.0)
  return gae_tokens(rewards, values, mask, gamma=gamma, lam=lam, whiten=whiten, whitening=whitening)


# Config name -> adapter over AdvantageInputs.
ADVANTAGES: dict[str, Callable] = {
  "gae": _gae_entry,
}

# Critic losses: fn(values, old_values, returns, mask, *, clip_eps, ...) -> (loss, metrics).
VALUE_LOSSES: dict[str, Callable] = {
  "clipped_mse": clipped_mse,
}
