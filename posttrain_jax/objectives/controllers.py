"""Controllers of loss coefficients, and the DCMDP constraint term whose λ one of them moves.

Shapes: ``B`` sequences, ``T`` completion tokens; masks are float ``[B, T]``.

A loss term returns ``(value, metrics)``. A controller is a pair of pure functions
``init(**hparams) -> state`` and ``update(state, metrics, **hparams) -> state`` over a small
NamedTuple of float32 scalars (DESIGN.md section 3, step 8); it reads this step's metrics by
name, so it is jittable and checkpointable with the train state. :data:`CONTROLLERS` maps a
name to its ``(init, update)`` pair.
"""

from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp

from posttrain_jax.objectives import kl, reductions
from posttrain_jax.objectives.hysteretic import beta_from_counts


def _f32(x) -> jax.Array:
  return jnp.asarray(x, jnp.float32)


# ----------------------------------------------------------------------------------------------
# DCMDP: discrepancy-constrained Lagrangian (arXiv 2606.08779; methods_A §3, derived).
# ----------------------------------------------------------------------------------------------
class DCMDPState(NamedTuple):
  """The Lagrange multiplier λ ≥ 0 (float32 scalar)."""

  lam: jax.Array


def dcmdp_term(
  trainer_logprobs: jax.Array,
  sampler_logprobs: jax.Array,
  mask: jax.Array,
  *,
  lam: float | jax.Array,
  delta: float | jax.Array,
):
  """DCMDP constraint term λ (D̂(θ) - δ) of the Lagrangian L = L_PG + λ (D̂ - δ).

      ρ_t = exp(log π_θ(y_t) - log μ(y_t)),   k3_t = ρ_t - 1 - log ρ_t ≥ 0
      D̂   = Σ m k3 / Σ m                      (E_μ[k3] = KL(μ ‖ π_θ) exactly, y ~ μ)

  [derived] The gradient flows through ``trainer_logprobs`` only: ∂D̂/∂log π_θ(y_t) =
  (ρ_t - 1)/Σ m, pulling π_θ toward the sampler μ on the sampled tokens. λ and the sampler
  log-probs are stop-gradient. λ = 0 gives a zero term (the base loss).

  Args:
    trainer_logprobs: [B, T] float32 log π_θ (differentiated).
    sampler_logprobs: [B, T] float32 log μ from the sampler (stop-gradient).
    mask: [B, T] float32 completion mask.
    lam: λ ≥ 0, scalar (e.g. ``DCMDPState.lam``).
    delta: tolerance δ.

  Returns:
    (λ (D̂ - δ), metrics ``dcmdp/d_hat``, ``dcmdp/d_num``, ``dcmdp/d_den``, ``dcmdp/lambda``,
    ``loss/dcmdp``).
  """
  chex.assert_rank([trainer_logprobs, sampler_logprobs, mask], 2)
  chex.assert_equal_shape([trainer_logprobs, sampler_logprobs, mask])
  chex.assert_type([trainer_logprobs, sampler_logprobs, mask], float)
  lam = jax.lax.stop_gradient(_f32(lam))
  chex.assert_rank(lam, 0)
  sampler = jnp.where(mask > 0, jax.lax.stop_gradient(sampler_logprobs), 0.0)
  trainer = jnp.where(mask > 0, trainer_logprobs, 0.0)
  k3 = kl.kl_k3(sampler, trainer)  # log r = trainer - sampler = log ρ
  num, den = reductions.masked_sum(k3, mask), jnp.sum(mask)
  d_hat = num / jnp.maximum(den, 1.0)
  value = lam * (d_hat - delta)
  return value, {
    "dcmdp/d_hat": d_hat,
    "dcmdp/d_num": num,
    "dcmdp/d_den": den,
    "dcmdp/lambda": lam,
    "loss/dcmdp": value,
  }


def dcmdp_init(*, lam0: float = 0.0) -> DCMDPState:
  """λ_0 (methods_A suggests 0)."""
  return DCMDPState(lam=_f32(lam0))


def dcmdp_update(
  state: DCMDPState,
  metrics: dict,
  *,
  lr: float,
  lam_max: float,
  delta: float | jax.Array,
  dead_zone: bool = False,
  decay: float = 0.0,
  key: str = "dcmdp/d_hat",
) -> DCMDPState:
  """Projected dual ascent on λ from this step's D̂ = ``metrics[key]`` [derived]:

      g  = D̂ - δ                     (``dead_zone=True``: g = max(D̂ - δ, 0))
      λ' = λ + η g;   if D̂ ≤ δ:  λ' ← (1 - κ) λ'
      λ  ← clip(λ', 0, λ_max)

  So λ ≥ 0 always, rises while D̂ > δ and never rises while D̂ ≤ δ (it falls by η(δ - D̂) in the
  plain form; in the dead-zone form only the decay κ moves it).

  Args:
    state: DCMDPState.
    metrics: dict holding the scalar ``key``.
    lr: η_λ (methods_A suggests 0.05). lam_max: λ_max. delta: δ.
    dead_zone: grow only on violations. decay: κ in [0, 1], applied while D̂ ≤ δ.
    key: metric name of D̂.
  """
  d_hat = jax.lax.stop_gradient(_f32(metrics[key]))
  gap = d_hat - delta
  step = jnp.maximum(gap, 0.0) if dead_zone else gap
  lam = state.lam + lr * step
  lam = jnp.where(gap <= 0, (1.0 - decay) * lam, lam)
  return DCMDPState(lam=jnp.clip(lam, 0.0, lam_max))


# ----------------------------------------------------------------------------------------------
# KL-coefficient controllers (Ziegler et al. 2019, "Fine-tuning LMs from human preferences").
# ----------------------------------------------------------------------------------------------
class KLControllerState(NamedTuple):
  """The KL coefficient β (float32 scalar)."""

  coef: jax.Array


def kl_controller_init(*, coef: float = 0.1) -> KLControllerState:
  """β_0 (ours: 0.1; TRL uses 0.2)."""
  return KLControllerState(coef=_f32(coef))


def fixed_kl_controller(state: KLControllerState, metrics: dict) -> KLControllerState:
  """β_{t+1} = β_t (a constant coefficient; ``metrics`` unused)."""
  del metrics
  return state


def adaptive_kl_controller(
  state: KLControllerState,
  metrics: dict,
  *,
  n_steps: int,
  target: float = 6.0,
  horizon: float = 10000.0,
  key: str = "kl/ref",
) -> KLControllerState:
  """Adaptive KL coefficient (Ziegler et al. 2019, section 2.2; as in TRL):

      e_t     = clip(KL_t / KL_target - 1, -0.2, 0.2)
      β_{t+1} = β_t (1 + e_t · n_steps / horizon)

  β grows when the measured KL is above target and shrinks when below.

  Args:
    state: KLControllerState.
    metrics: dict holding the scalar KL ``key`` (the train step logs ``kl/ref``).
    n_steps: samples in this step (K_β = n_steps / horizon).
    target: KL_target (Ziegler/TRL: 6). horizon: (Ziegler/TRL: 10000).
    key: metric name of the KL.
  """
  kl_t = jax.lax.stop_gradient(_f32(metrics[key]))
  err = jnp.clip(kl_t / target - 1.0, -0.2, 0.2)
  return KLControllerState(coef=state.coef * (1.0 + err * n_steps / horizon))


# ----------------------------------------------------------------------------------------------
# A-HPO's β as a controller (arXiv 2605.30201; methods_B §9, derived).
# ----------------------------------------------------------------------------------------------
class AHPOState(NamedTuple):
  """The negative-advantage weight β in [β_min, 1] (float32 scalar)."""

  beta: jax.Array


def a_hpo_init(*, beta0: float = 1.0) -> AHPOState:
  """β_0 = 1 (symmetric) until the first batch is seen."""
  return AHPOState(beta=_f32(beta0))


def a_hpo_update(
  state: AHPOState,
  metrics: dict,
  *,
  beta_min: float = 0.05,
  rule: str = "ratio",
  momentum: float = 0.0,
) -> AHPOState:
  """β ← m β + (1 - m) · clip(N_+/N_-, β_min, 1) from ``metrics['hpo/n_pos'|'hpo/n_neg']``.

  With momentum m = 0 (default) this is A-HPO's per-batch β (``a_hpo_beta``) computed on the
  whole batch, to pass to ``hpo(beta=state.beta)`` in the next step; m > 0 smooths it (ours).
  """
  target = beta_from_counts(
    _f32(metrics["hpo/n_pos"]), _f32(metrics["hpo/n_neg"]), beta_min=beta_min, rule=rule
  )
  return AHPOState(beta=momentum * state.beta + (1.0 - momentum) * target)


CONTROLLERS: dict[str, tuple[Callable, Callable]] = {
  "dcmdp": (dcmdp_init, dcmdp_update),
  "fixed_kl": (kl_controller_init, fixed_kl_controller),
  "adaptive_kl": (kl_controller_init, adaptive_kl_controller),
  "a_hpo": (a_hpo_init, a_hpo_update),
}
