"""Cross-domain interference of sequential RL (methods_A.md section 14): the damage a later
domain's update does to an earlier domain's loss, predicted to second order.

With ``theta_A`` the parameters after domain A and ``Delta_B`` the update of a later stage B,

    L_A(theta_A + Delta_B) - L_A(theta_A)  ~  g_A^T Delta_B + 1/2 Delta_B^T H_A Delta_B

(``g_A``, ``H_A``: the gradient and Hessian of ``L_A`` at ``theta_A``). The section's argument
is that ``g_A ~ 0`` after A, so the second-order term carries the damage even when the
gradients of A and B are orthogonal. :func:`damage` computes both terms exactly (the
Hessian-vector product by forward-over-reverse differentiation, no Hessian built) beside the
measured change, for any scalar ``loss_fn(params)`` (a domain's gold-row NLL in
``scripts/analyze.py domains``).
"""

import jax
import jax.numpy as jnp


def _vdot(a, b) -> jax.Array:
  return sum(
    jnp.vdot(x.astype(jnp.float32), y.astype(jnp.float32))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


def hvp(loss_fn, params, vector):
  """``H v`` with ``H`` the Hessian of ``loss_fn`` at ``params`` (forward over reverse)."""
  return jax.jvp(jax.grad(loss_fn), (params,), (vector,))[1]


def damage(loss_fn, theta_a, theta_b) -> dict:
  """``{"first_order": g^T D, "second_order": D^T H D / 2, "predicted": their sum,
  "measured": L(theta_b) - L(theta_a)}`` with ``D = theta_b - theta_a`` and ``g``, ``H`` the
  gradient and Hessian of ``loss_fn`` at ``theta_a`` (float32 host scalars)."""
  delta = jax.tree.map(lambda b, a: b.astype(jnp.float32) - a.astype(jnp.float32), theta_b, theta_a)
  grad, h_delta = jax.jvp(jax.grad(loss_fn), (theta_a,), (delta,))
  first = _vdot(grad, delta)
  second = 0.5 * _vdot(delta, h_delta)
  measured = loss_fn(theta_b) - loss_fn(theta_a)
  return {
    "first_order": float(first),
    "second_order": float(second),
    "predicted": float(first + second),
    "measured": float(measured),
  }


__all__ = ["damage", "hvp"]
