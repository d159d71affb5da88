"""The RL loss's named terms (DESIGN.md section 3, step 7): after the policy loss, each active
term of :data:`LOSS_TERMS` acts on the running loss in the table's order.

A term is ``apply(loss, x, controls, cfg) -> (loss, metrics)`` with ``x`` a :class:`TermInputs`
(the minibatch's forward and batch) and ``cfg`` the run's ``updates.RLLossConfig``; it is active
when ``active(cfg)``. A term usually adds ``coef * value`` to the loss; one may reweight it
(the teacher's distillation phase sets ``pg_coef * loss + distill_coef * D``). Coefficients a
controller sets are read from ``controls``. Adding a term: one function here, one entry in the
table, and the ``RLLossConfig`` fields it reads.
"""

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from posttrain_jax import objectives

FULL_KL = {"full_forward": "forward", "full_reverse": "reverse"}


class TermInputs(NamedTuple):
  """What a term reads: the forward's ``logprobs`` [b, T] and ``logits`` [b, T, V] (divided by
  the temperature), the per-token ``entropy`` [b, T] of those logits, the minibatch ``batch``
  (``train.inputs.TrainBatch``), its loss ``mask`` [b, T], the forward itself
  (``updates.CompletionForward``: MoE's load-balancing loss, the shared-prompt check) and the
  prompt width ``prompt_len``; ``sft_nll``: the cross-entropy of the batch's supervised rows
  (``sft_tokens``), None without them."""

  logprobs: jax.Array
  logits: jax.Array
  entropy: jax.Array
  batch: object
  mask: jax.Array
  forward: object
  prompt_len: int
  sft_nll: jax.Array | None = None


class LossTerm(NamedTuple):
  active: Callable
  apply: Callable
  doc: str = ""
  reads: tuple = ()  # batch fields (train.inputs.TrainBatch) the term needs computed


def distill(loss, x: TermInputs, controls: dict, cfg):
  """``pg_coef * loss + distill_coef * D``: the teacher's distillation term ``cfg.distill``
  (objectives.DIVERGENCES; it reads the batch's teacher log-probs or logits, stop-gradient)."""
  fn = objectives.lookup(objectives.DIVERGENCES, cfg.distill, "teacher loss")
  (field,) = getattr(fn, "reads", ("teacher_logits",))
  teacher = jax.lax.stop_gradient(getattr(x.batch, field))
  value, metrics = fn(x.logprobs, x.logits, teacher, x.mask, **dict(cfg.distill_kwargs))
  metrics = {**metrics, "loss/distill": value}
  return controls["pg_coef"] * loss + controls["distill_coef"] * value, metrics


def mismatch(loss, x: TermInputs, controls: dict, cfg):
  """No loss: the train-inference mismatch metrics from the loss's own log-probs."""
  del controls, cfg
  logprobs = jax.lax.stop_gradient(x.logprobs)
  return loss, objectives.mismatch_metrics(logprobs, x.batch.behaviour_logprobs, x.mask)


def kl(loss, x: TermInputs, controls: dict, cfg):
  """``kl_coef * KL(policy || reference)``: a sampled-token estimator (objectives.KL_ESTIMATORS,
  with ``kl_estimator_kwargs``) or the exact KL over the vocabulary from the reference's logits
  (``full_*``), averaged over the tokens (``kl_aggregation="token_mean"``) or with the policy
  loss's aggregation (``"policy"``, as verl's actor and TRL do); with ``kl_bias_correction``
  each token's estimate is weighted by π/π_old (the ratio keeps its gradient), as TRL does by
  default for samples drawn from the old policy."""
  if cfg.kl_estimator in FULL_KL:
    ref_logits = jax.lax.stop_gradient(x.batch.ref_logits)
    per_token = objectives.token_full_kl(x.logits, ref_logits, direction=FULL_KL[cfg.kl_estimator])
  else:
    kl_fn = objectives.lookup(objectives.KL_ESTIMATORS, cfg.kl_estimator, "KL estimator")
    ref = jax.lax.stop_gradient(x.batch.ref_logprobs)
    per_token = kl_fn(x.logprobs, ref, **dict(cfg.kl_estimator_kwargs))
  if cfg.kl_bias_correction:  # samples come from π_old: weight each token by π/π_old
    old = jax.lax.stop_gradient(x.batch.old_logprobs)
    log_ratio = jnp.clip(jnp.where(x.mask > 0, x.logprobs - old, 0.0), -20.0, 20.0)
    per_token = per_token * jnp.exp(log_ratio)
  if cfg.kl_aggregation == "policy":
    mode, length = cfg.aggregation, cfg.norm_length
    value = objectives.aggregate(per_token, x.mask, mode=mode, norm_length=length).value
  else:
    value = objectives.masked_mean(per_token, x.mask)
  return loss + controls["kl_coef"] * value, {"kl/ref": value}


def entropy(loss, x: TermInputs, controls: dict, cfg):
  """``- entropy_coef * H`` (H logged as ``policy/entropy`` whatever the coefficient)."""
  del controls
  value = objectives.masked_mean(x.entropy, x.mask)
  if cfg.entropy_coef:
    loss = loss - cfg.entropy_coef * value
  return loss, {"policy/entropy": value}


def dcmdp(loss, x: TermInputs, controls: dict, cfg):
  """DCMDP's ``lambda (D_hat - delta)`` with ``lambda`` and ``delta`` from its controller."""
  del cfg
  term, metrics = objectives.dcmdp_term(
    x.logprobs,
    x.batch.behaviour_logprobs,
    x.mask,
    lam=controls["dcmdp_lam"],
    delta=controls["dcmdp_delta"],
  )
  return loss + term, metrics


def auxiliary(loss, x: TermInputs, controls: dict, cfg):
  """The auxiliary loss ``cfg.aux_loss`` (objectives.AUX_LOSSES, e.g. EchoRL's clips), which
  reads the rewards, groups and the completion's reasoning-step ends."""
  del controls
  aux_fn = objectives.lookup(objectives.AUX_LOSSES, cfg.aux_loss, "auxiliary loss")
  b = x.batch
  completion = b.tokens[:, x.prompt_len :]
  step_end = objectives.step_ends_from_tokens(completion, x.mask, delimiter_ids=cfg.step_delimiters)
  aux, metrics = aux_fn(
    x.logprobs,
    jax.lax.stop_gradient(x.entropy),
    b.rewards,
    b.group,
    b.valid,
    x.mask,
    step_end,
    num_groups=cfg.num_groups,
    **dict(cfg.aux_loss_kwargs),
  )
  return loss + aux, metrics


def moe_balance(loss, x: TermInputs, controls: dict, cfg):
  """A mixture-of-experts model's load-balancing loss, weighted by its
  ``router_aux_loss_coef`` (logged unweighted as ``moe/aux_loss``)."""
  del controls, cfg
  fwd = x.forward
  if fwd.aux_loss is None:  # a dense model
    return loss, {}
  return loss + fwd.aux_coef * fwd.aux_loss, {"moe/aux_loss": fwd.aux_loss}


def sft_mix(loss, x: TermInputs, controls: dict, cfg):
  """RL+SFT parallel averaging: ``sft_beta * loss + (1 - sft_beta) * CE``, so the update's
  gradient is ``beta grad L_RL + (1 - beta) grad L_CE`` (the CE of the supervised rows drawn
  beside the RL rows; methods/sft_mix/)."""
  del controls
  beta = cfg.sft_beta
  return beta * loss + (1.0 - beta) * x.sft_nll, {"loss/sft_nll": x.sft_nll}


def prefix_check(loss, x: TermInputs, controls: dict, cfg):
  """No loss: the shared-prompt forward's count of rows whose prompt differs from their
  group's (``train/prefix_mismatch``; the step raises when it is not 0)."""
  del controls, cfg
  if x.forward.prefix_mismatch is None:  # the full forward
    return loss, {}
  return loss, {"train/prefix_mismatch": x.forward.prefix_mismatch.astype(jnp.float32)}


LOSS_TERMS: dict[str, LossTerm] = {
  "distill": LossTerm(lambda cfg: bool(cfg.distill), distill, "teacher distillation"),
  "mismatch": LossTerm(lambda cfg: cfg.mismatch_in_loss, mismatch, "mismatch metrics"),
  "kl": LossTerm(lambda cfg: cfg.kl_in_loss, kl, "KL to the reference"),
  "entropy": LossTerm(lambda cfg: True, entropy, "entropy bonus"),
  "dcmdp": LossTerm(lambda cfg: cfg.dcmdp, dcmdp, "DCMDP Lagrangian"),
  "aux": LossTerm(lambda cfg: bool(cfg.aux_loss), auxiliary, "auxiliary loss"),
  "moe_balance": LossTerm(lambda cfg: True, moe_balance, "MoE load balancing"),
  "sft_mix": LossTerm(
    lambda cfg: cfg.sft_beta < 1.0, sft_mix, "RL+SFT averaging", ("sft_tokens", "sft_mask")
  ),
  "prefix_check": LossTerm(lambda cfg: True, prefix_check, "shared-prompt check"),
}


def reads(cfg) -> frozenset:
  """The batch fields the active terms of ``cfg`` (``updates.RLLossConfig``) read."""
  return frozenset(f for t in LOSS_TERMS.values() if t.active(cfg) for f in t.reads)
