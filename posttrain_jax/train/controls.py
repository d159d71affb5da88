"""The RL loop's controllers (DESIGN.md section 3, step 8): scalars the loss reads from
``controls`` and that move with the run's metrics.

Each entry of :data:`CONTROLLERS` says when it is on for a ``config.rl`` and how it moves; the
math is in ``objectives.controllers``. ``controls`` (a dict of float32 scalars, checkpointed
with the run state) always holds every key, so the update's signature never depends on the
config.

- ``a_hpo``: before the update, HPO's β from the batch's advantage signs (A-HPO).
- ``dcmdp``: after the update, DCMDP's λ by projected dual ascent on the measured D̂; before
  the first update, δ from that batch's D̂ when ``rl.dcmdp.delta_from='first_step'``.
- ``adaptive_kl``: after the update, the KL coefficient toward ``kl_target`` (Ziegler et al.).
"""

from typing import Callable, NamedTuple

import jax.numpy as jnp

from posttrain_jax import objectives
from posttrain_jax.objectives import refresh_rules


class Controller(NamedTuple):
  """``active(cfg)``; ``before(cfg, controls, batch)`` and ``after(cfg, controls, metrics)``
  return the new controls (either may be None); ``key``: the controls entry it logs as
  ``control/<key>``; ``also``: further entries it logs (after the update)."""

  active: Callable
  key: str
  before: Callable | None = None
  after: Callable | None = None
  also: tuple = ()


def _a_hpo_before(cfg, controls: dict, batch) -> dict:
  _, counts = objectives.a_hpo_beta(batch.advantages, batch.mask)
  state = objectives.a_hpo_update(
    objectives.AHPOState(beta=controls["hpo_beta"]),
    counts,
    beta_min=cfg.hpo.beta_min,
    rule=cfg.hpo.rule,
    momentum=cfg.hpo.momentum,
  )
  return {**controls, "hpo_beta": state.beta}


UNMEASURED = -1.0  # δ before the first batch measured it (``delta_from='first_step'``)


def _dcmdp_before(cfg, controls: dict, batch) -> dict:
  """δ ← D̂ of the first batch (trainer's recomputed log-probs against the sampler's, before
  any update), once; a no-op for ``delta_from='value'`` and after the first step."""
  if cfg.dcmdp.delta_from != "first_step" or float(controls["dcmdp_delta"]) != UNMEASURED:
    return controls
  _, m = objectives.dcmdp_term(
    batch.old_logprobs, batch.behaviour_logprobs, batch.mask, lam=0.0, delta=0.0
  )
  return {**controls, "dcmdp_delta": jnp.asarray(m["dcmdp/d_hat"], jnp.float32)}


def _dcmdp_after(cfg, controls: dict, metrics: dict) -> dict:
  d = cfg.dcmdp
  state = objectives.dcmdp_update(
    objectives.DCMDPState(lam=controls["dcmdp_lam"]),
    metrics,
    lr=d.lr,
    lam_max=d.lam_max,
    delta=controls["dcmdp_delta"],
    dead_zone=d.dead_zone,
    decay=d.decay,
  )
  return {**controls, "dcmdp_lam": state.lam}


def _adaptive_kl_after(cfg, controls: dict, metrics: dict) -> dict:
  if "kl/ref" not in metrics:
    return controls
  state = objectives.adaptive_kl_controller(
    objectives.KLControllerState(coef=controls["kl_coef"]),
    metrics,
    n_steps=cfg.prompts_per_step * cfg.group_size,
    target=cfg.kl_target,
    horizon=cfg.kl_horizon,
  )
  return {**controls, "kl_coef": state.coef}


CONTROLLERS: dict[str, Controller] = {
  "a_hpo": Controller(lambda cfg: cfg.hpo.controller == "a_hpo", "hpo_beta", before=_a_hpo_before),
  "dcmdp": Controller(
    lambda cfg: cfg.dcmdp.enabled,
    "dcmdp_lam",
    before=_dcmdp_before,
    after=_dcmdp_after,
    also=("dcmdp_delta",),
  ),
  "adaptive_kl": Controller(
    lambda cfg: bool(cfg.kl_coef) and cfg.kl_controller == "adaptive",
    "kl_coef",
    after=_adaptive_kl_after,
  ),
}


def init_controls(cfg) -> dict:
  """Every controller's starting value (present whether or not it is on)."""
  return {
    "kl_coef": jnp.asarray(cfg.kl_coef, jnp.float32),
    "dcmdp_lam": jnp.asarray(cfg.dcmdp.lam0, jnp.float32),
    "dcmdp_delta": jnp.asarray(
      UNMEASURED if cfg.dcmdp.delta_from == "first_step" else cfg.dcmdp.delta, jnp.float32
    ),
    "hpo_beta": objectives.a_hpo_init().beta,
    # The teacher's distillation phase (the teacher method sets both every step).
    "distill_coef": jnp.asarray(cfg.teacher.coef if cfg.teacher.loss else 0.0, jnp.float32),
    "pg_coef": jnp.asarray(1.0, jnp.float32),
  }


def before_update(cfg, controls: dict, batch) -> dict:
  """The controls the update uses: those that read this step's batch moved first."""
  for c in CONTROLLERS.values():
    if c.before is not None and c.active(cfg):
      controls = c.before(cfg, controls, batch)
  return controls


def after_update(cfg, controls: dict, metrics: dict) -> tuple[dict, dict]:
  """``(controls for the next step, control/* metrics)``: the controllers that read this step's
  metrics move; logged are the values the update used for those acting before it and the
  moved values (what the next update uses) for the others, the KL coefficient always."""
  logged = {
    f"control/{c.key}": float(controls[c.key])
    for c in CONTROLLERS.values()
    if c.before is not None and c.active(cfg)
  }
  for c in CONTROLLERS.values():
    if c.after is not None and c.active(cfg):
      controls = c.after(cfg, controls, metrics)
      logged[f"control/{c.key}"] = float(controls[c.key])
    if c.active(cfg):
      logged.update({f"control/{k}": float(controls[k]) for k in c.also})
  logged["control/kl_coef"] = float(controls["kl_coef"])
  return controls, logged


def refresh_reference(cfg, state: dict, policy, record: dict, step: int) -> tuple[dict, dict]:
  """After the update of step ``step`` (0-based): ``config.rl.ref_rule`` (a refresh rule,
  ``objectives.refresh_rules``; TRL's ``sync_ref_model`` is ``every``) decides from the step's
  ``record`` and mixes ``policy`` (the updated policy's full parameters) into the reference
  (``state['reference']``). Returns the new state and the rule's metrics (``reference/*``)."""
  fn = refresh_rules.lookup(cfg.ref_rule)
  mix, rule_state, m = fn(state["reference_rule"], record, step + 1, **dict(cfg.ref_rule_kwargs))
  state = {**state, "reference_rule": rule_state}
  if mix > 0.0:
    state["reference"] = refresh_rules.blend(state["reference"], policy, float(mix))
  return state, {"reference/" + k.split("/", 1)[-1]: float(v) for k, v in m.items()}
