"""Preference losses on sequence log-probabilities: DPO, IPO, SimPO and KTO.

Every entry of :data:`PREFERENCE_LOSSES` has one signature, so the preference stage calls any of
them the same way::

    fn(chosen, rejected, ref_chosen, ref_rejected, chosen_len, rejected_len, **hparams)
      -> (scalar loss, metrics)

- ``chosen``, ``rejected`` [B] float32: the policy's summed log-probabilities of each pair's
  preferred and dispreferred completion (differentiated);
- ``ref_chosen``, ``ref_rejected`` [B]: the same under the frozen reference (stop-gradient
  inside; a reference-free loss ignores them);
- ``chosen_len``, ``rejected_len`` [B]: the completions' token counts (SimPO's length
  normalisation; the others ignore them).

With the implicit reward ``r(y) = beta (log pi(y) - log pi_ref(y))`` and the pair's margin
``h = (log pi(y_c) - log pi_ref(y_c)) - (log pi(y_r) - log pi_ref(y_r))``:

- ``dpo`` (Rafailov et al. 2023): ``-log sigmoid(beta h)``; with ``label_smoothing`` eps the
  conservative form ``-(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)``. Its gradient
  is ``-beta sigmoid(-beta h) (grad log pi(y_c) - grad log pi(y_r))``; as beta -> 0 the loss
  tends to log 2.
- ``ipo`` (Azar et al. 2023): ``(h - 1 / (2 beta))^2``, minimised at ``h = 1 / (2 beta)``. TRL
  feeds IPO token-averaged log-probs; here the caller chooses (the stage's ``average``).
- ``simpo`` (Meng et al. 2024), reference-free: ``-log sigmoid(beta (log pi(y_c) / |y_c| -
  log pi(y_r) / |y_r|) - gamma)``.
- ``kto`` (Ethayarajh et al. 2024), unpaired: each pair gives a desirable (chosen) and an
  undesirable (rejected) example; ``z = max(0, KL estimate)`` (stop-gradient), the loss
  ``lambda_d (1 - sigmoid(beta (r_c - z)))`` plus ``lambda_u (1 - sigmoid(beta (z - r_r)))``
  averaged over the examples, ``r = log pi - log pi_ref``. The paper estimates the KL from
  mismatched (prompt, completion) pairs; here ``kl`` gives it, and without it the batch's own
  mean log-ratio over both completions stands in (a derived convention, easy to change).

Metrics: ``pref/reward_chosen``, ``pref/reward_rejected`` (mean implicit rewards), ``pref/margin``
(their mean difference) and ``pref/accuracy`` (share of pairs whose chosen reward is higher).
"""

import jax
import jax.numpy as jnp

sg = jax.lax.stop_gradient


def _rewards(chosen, rejected, ref_chosen, ref_rejected, beta):
  rc = beta * (chosen - sg(ref_chosen))
  rr = beta * (rejected - sg(ref_rejected))
  return rc, rr


def _metrics(rc, rr) -> dict:
  rc, rr = sg(rc), sg(rr)
  return {
    "pref/reward_chosen": jnp.mean(rc),
    "pref/reward_rejected": jnp.mean(rr),
    "pref/margin": jnp.mean(rc - rr),
    "pref/accuracy": jnp.mean((rc > rr).astype(jnp.float32)),
  }


def dpo(
  chosen,
  rejected,
  ref_chosen,
  ref_rejected,
  chosen_len=None,
  rejected_len=None,
  *,
  beta: float = 0.1,
  label_smoothing: float = 0.0,
):
  """DPO's loss ``-log sigmoid(beta h)`` (conservative with ``label_smoothing``)."""
  del chosen_len, rejected_len
  rc, rr = _rewards(chosen, rejected, ref_chosen, ref_rejected, beta)
  z = rc - rr
  losses = -(1.0 - label_smoothing) * jax.nn.log_sigmoid(z) - label_smoothing * jax.nn.log_sigmoid(
    -z
  )
  return jnp.mean(losses), _metrics(rc, rr)


def ipo(
  chosen, rejected, ref_chosen, ref_rejected, chosen_len=None, rejected_len=None, *, beta=0.1
):
  """IPO's loss ``(h - 1 / (2 beta))^2``."""
  del chosen_len, rejected_len
  h = (chosen - sg(ref_chosen)) - (rejected - sg(ref_rejected))
  rc, rr = _rewards(chosen, rejected, ref_chosen, ref_rejected, beta)
  return jnp.mean(jnp.square(h - 1.0 / (2.0 * beta))), _metrics(rc, rr)


def simpo(
  chosen,
  rejected,
  ref_chosen=None,
  ref_rejected=None,
  chosen_len=None,
  rejected_len=None,
  *,
  beta: float = 2.0,
  gamma: float = 0.5,
):
  """SimPO's reference-free loss on length-normalised log-probs with target margin ``gamma``."""
  del ref_chosen, ref_rejected
  rc = beta * chosen / jnp.maximum(chosen_len, 1.0)
  rr = beta * rejected / jnp.maximum(rejected_len, 1.0)
  return jnp.mean(-jax.nn.log_sigmoid(rc - rr - gamma)), _metrics(rc, rr)


def kto(
  chosen,
  rejected,
  ref_chosen,
  ref_rejected,
  chosen_len=None,
  rejected_len=None,
  *,
  beta: float = 0.1,
  desirable_weight: float = 1.0,
  undesirable_weight: float = 1.0,
  kl=None,
):
  """KTO's loss with the reference point ``z = max(0, kl)`` (stop-gradient); ``kl=None``: the
  batch's mean log-ratio over both completions (derived, see the module docstring)."""
  del chosen_len, rejected_len
  lc, lr = chosen - sg(ref_chosen), rejected - sg(ref_rejected)
  if kl is None:
    kl = jnp.mean(jnp.concatenate([lc, lr]))
  z = sg(jnp.maximum(jnp.asarray(kl, jnp.float32), 0.0))
  desirable = desirable_weight * (1.0 - jax.nn.sigmoid(beta * (lc - z)))
  undesirable = undesirable_weight * (1.0 - jax.nn.sigmoid(beta * (z - lr)))
  loss = jnp.mean(jnp.concatenate([desirable, undesirable]))
  metrics = {**_metrics(beta * lc, beta * lr), "pref/kl_ref": z}
  return loss, metrics


PREFERENCE_LOSSES = {"dpo": dpo, "ipo": ipo, "simpo": simpo, "kto": kto}
REFERENCE_FREE = frozenset({"simpo"})

__all__ = ["PREFERENCE_LOSSES", "REFERENCE_FREE", "dpo", "ipo", "kto", "simpo"]
