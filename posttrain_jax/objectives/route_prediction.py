"""PR2's route predictor (Predictive Routing Replay, arXiv 2606.00395; methods_B.md section 3).

Per MoE layer ``l``, at a token whose router input is ``x`` [D]:

* router logits ``g = x W_l`` [E];
* predicted logits ``g_hat = g + f_phi(x)`` with the low-rank predictor
  ``f_phi(x) = x V_l U_l`` (``V_l`` [D, r] "down", ``U_l`` [r, E] "up"), meant to approximate
  the router logits ``K`` policy updates ahead. Being linear in ``x``, ``f_phi`` is a rank-``r``
  shift of the router matrix, ``M_l = V_l U_l`` [D, E] (:func:`shift`), which a rollout routes
  with (``models.moe.route``: ``S = TopK(x (W_l + M_l))``).

Predictor training *[derived: the abstract gives no loss]*: on router inputs ``x`` and logits
``g_old`` recorded after one update, and the logits ``g_new`` of the same tokens ``K`` updates
later (targets under stop-gradient),

* ``mse``: ``mean_tokens (1/E) || g_old + f_phi(x) - g_new ||^2`` (methods_B.md's formula), or
* ``kl``: ``mean_tokens KL(softmax(g_new) || softmax(g_old + f_phi(x)))``,

averaged over layers and the real tokens (``mask``). :func:`fit` takes a few optimiser steps of
its own (the predictor has its own optimiser). ``U`` starts at zero, so ``f_phi = 0`` and PR2
starts as R3 exactly.

Shapes: ``L`` MoE layers, ``N`` tokens, ``D`` router input width, ``E`` experts, ``r`` rank.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

LOSSES = ("mse", "kl")


class Predictor(NamedTuple):
  """``down`` [L, D, r] (``V``), ``up`` [L, r, E] (``U``)."""

  down: jax.Array
  up: jax.Array


def init(key: jax.Array, layers: int, width: int, experts: int, rank: int) -> Predictor:
  """``V`` ~ N(0, 1/D) (orthogonal-ish random projection of the router input), ``U`` = 0
  (``f_phi`` = 0: PR2 starts as R3)."""
  down = jax.random.normal(key, (layers, width, rank), jnp.float32) / jnp.sqrt(width)
  return Predictor(down, jnp.zeros((layers, rank, experts), jnp.float32))


def shift(p: Predictor) -> jax.Array:
  """[L, D, E] the predicted change of each layer's router matrix, ``M_l = V_l U_l``."""
  return jnp.einsum("ldr,lre->lde", p.down, p.up)


def predicted_logits(p: Predictor, x: jax.Array, g: jax.Array) -> jax.Array:
  """``g + f_phi(x)``: ``x`` [L, N, D], ``g`` [L, N, E] -> [L, N, E]."""
  return g + jnp.einsum("lnd,lde->lne", x, shift(p))


def loss(
  p: Predictor,
  x: jax.Array,
  g_old: jax.Array,
  g_new: jax.Array,
  mask: jax.Array,
  kind: str = "mse",
) -> jax.Array:
  """The predictor's loss (module docstring): ``x`` [L, N, D] router inputs, ``g_old`` and
  ``g_new`` [L, N, E] logits now and ``K`` updates later, ``mask`` [N] real tokens. Scalar."""
  if kind not in LOSSES:
    raise ValueError(f"unknown route-predictor loss {kind!r}; known: {list(LOSSES)}")
  pred = predicted_logits(p, x, g_old)
  target = jax.lax.stop_gradient(g_new)
  if kind == "mse":
    per_token = jnp.mean(jnp.square(pred - target), axis=-1)  # [L, N]
  else:
    logq = jax.nn.log_softmax(pred, axis=-1)
    logp = jax.nn.log_softmax(target, axis=-1)
    per_token = jnp.sum(jnp.exp(logp) * (logp - logq), axis=-1)
  per_token = jnp.mean(per_token, axis=0)  # [N], the layers' mean
  return jnp.sum(per_token * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def fit(
  p: Predictor,
  opt_state,
  tx: optax.GradientTransformation,
  x: jax.Array,
  g_old: jax.Array,
  g_new: jax.Array,
  mask: jax.Array,
  *,
  steps: int,
  kind: str = "mse",
):
  """``steps`` optimiser steps of :func:`loss` on one cached batch. Returns ``(predictor,
  opt_state, metrics)`` with ``loss_before``, ``loss_after`` and ``drift`` (the loss of
  ``f_phi = 0``: how far the router moved in ``K`` updates)."""
  value_and_grad = jax.value_and_grad(loss)

  def one(carry, _):
    q, s = carry
    value, grads = value_and_grad(q, x, g_old, g_new, mask, kind)
    updates, s = tx.update(grads, s, q)
    return (optax.apply_updates(q, updates), s), value

  (p, opt_state), values = jax.lax.scan(one, (p, opt_state), None, length=steps)
  zero = p._replace(up=jnp.zeros_like(p.up))
  metrics = {
    "loss_before": values[0],
    "loss_after": loss(p, x, g_old, g_new, mask, kind),
    "drift": loss(zero, x, g_old, g_new, mask, kind),
  }
  return p, opt_state, metrics


def topk_overlap(a: jax.Array, b: jax.Array, k: int) -> jax.Array:
  """Mean ``|TopK(a) ∩ TopK(b)| / k`` over the leading axes of logits ``a``, ``b`` [..., E]
  (unweighted)."""
  _, ia = jax.lax.top_k(a, k)
  _, ib = jax.lax.top_k(b, k)
  hit = jnp.any(ia[..., :, None] == ib[..., None, :], axis=-1)
  return jnp.mean(hit.astype(jnp.float32))
