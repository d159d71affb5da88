"""Pure math of RL post-training: advantages, policy losses, KL, entropy, reductions.

Arrays in, arrays out: nothing here sees a model, a tokenizer or a config. Pieces are looked up
by name in plain dicts (``ADVANTAGES``, ``POLICY_LOSSES``, ``KL_ESTIMATORS``, ``AGGREGATIONS``,
...), each built once in ``registries`` from the dicts of the files that define its entries.

Files: ``advantage_inputs`` (AdvantageInputs, GroupStats, shared helpers), ``group_baselines``
(GRPO, Dr.GRPO, RLOO, OPO, GPG, REINFORCE++, ReMax), ``pass_at_k_family`` (pass@K, max@K, MaxPO),
``distillation`` (OPD, GNDPO), ``divergences`` (distillation loss terms: forward/reverse KL,
GKD's JSD, sampled-token KL), ``value`` (GAE, value loss), ``ppo_family`` (token-ratio policy losses), ``sequence_level``
(GSPO, LUSPO, GMPO, VESPO), ``hysteretic`` (HPO, A-HPO),
``covariance`` (Clip-Cov, KL-Cov), ``preference`` (DPO, IPO, SimPO, KTO), ``perturbation``
(weight-space search: CoRP, RandOpt, ES consolidations and the validation gate),
``state_values`` (Numca and Hista: leave-one-out state values from the group's other
rollouts), ``controllers`` (DCMDP term, KL and A-HPO controllers), ``kl``, ``mismatch``, ``reductions``,
``auxiliary``, ``shaping``, and ``pass_at_k_metric`` (the evaluation pass@k estimator).
"""

from posttrain_jax.objectives.advantage_inputs import AdvantageInputs
from posttrain_jax.objectives.auxiliary import echo_clip_loss, step_ends_from_tokens
from posttrain_jax.objectives.controllers import (
  AHPOState,
  DCMDPState,
  KLControllerState,
  a_hpo_init,
  a_hpo_update,
  adaptive_kl_controller,
  dcmdp_term,
  dcmdp_update,
)
from posttrain_jax.objectives.distillation import gndpo, opd
from posttrain_jax.objectives.divergences import (
  CHUNK_THRESHOLD,
  forward_kl_loss,
  jsd_loss,
  k1_loss,
  k2_loss,
  k3_loss,
  reverse_kl_loss,
  token_entropy,
  token_forward_kl,
  token_generalized_jsd,
  token_reverse_kl,
)
from posttrain_jax.objectives.group_baselines import (
  dr_grpo,
  grpo,
  reinforce_pp,
  reinforce_pp_baseline,
  remax,
  rloo,
)
from posttrain_jax.objectives.hysteretic import a_hpo_beta
from posttrain_jax.objectives.kl import (
  entropy_from_logits,
  full_kl,
  kl_k1,
  kl_k2,
  kl_k3,
  token_full_kl,
)
from posttrain_jax.objectives.mismatch import mis_weights, mismatch_metrics, tis_weights
from posttrain_jax.objectives.pass_at_k_family import max_at_k, maxpo
from posttrain_jax.objectives.pass_at_k_family import pass_at_k as pass_at_k_advantages
from posttrain_jax.objectives.pass_at_k_metric import pass_at_k
from posttrain_jax.objectives.ppo_family import ppo_clip, reinforce
from posttrain_jax.objectives.reductions import (
  Aggregate,
  aggregate,
  masked_mean,
  masked_sum,
  masked_var,
  masked_whiten,
)
from posttrain_jax.objectives.registries import (
  ADVANTAGES,
  AGGREGATIONS,
  AUX_LOSSES,
  CONSOLIDATIONS,
  CONTROLLERS,
  DIVERGENCES,
  IS_CORRECTIONS,
  KL_ESTIMATORS,
  POLICY_LOSSES,
  PREFERENCE_LOSSES,
  SHAPINGS,
  VALUE_LOSSES,
)
from posttrain_jax.objectives.shaping import ShapingInputs, overlong_penalty
from posttrain_jax.objectives.state_values import (
  hista_values,
  loo_group_mean,
  milestone_keys,
  numca_values,
)
from posttrain_jax.objectives.value import gae_advantages, terminal_rewards
from posttrain_jax.registry import lookup

__all__ = [
  "ADVANTAGES",
  "AGGREGATIONS",
  "AdvantageInputs",
  "Aggregate",
  "KL_ESTIMATORS",
  "POLICY_LOSSES",
  "PREFERENCE_LOSSES",
  "CONSOLIDATIONS",
  "aggregate",
  "dr_grpo",
  "entropy_from_logits",
  "grpo",
  "kl_k1",
  "kl_k2",
  "kl_k3",
  "lookup",
  "masked_mean",
  "masked_sum",
  "masked_var",
  "masked_whiten",
  "pass_at_k",
  "ppo_clip",
  "reinforce",
  "VALUE_LOSSES",
  "gae_advantages",
  "gndpo",
  "max_at_k",
  "maxpo",
  "milestone_keys",
  "loo_group_mean",
  "numca_values",
  "hista_values",
  "opd",
  "pass_at_k_advantages",
  "reinforce_pp",
  "reinforce_pp_baseline",
  "remax",
  "rloo",
  "terminal_rewards",
  "AUX_LOSSES",
  "CONTROLLERS",
  "DCMDPState",
  "IS_CORRECTIONS",
  "KLControllerState",
  "AHPOState",
  "a_hpo_beta",
  "a_hpo_init",
  "a_hpo_update",
  "adaptive_kl_controller",
  "dcmdp_term",
  "dcmdp_update",
  "echo_clip_loss",
  "full_kl",
  "token_full_kl",
  "mis_weights",
  "mismatch_metrics",
  "step_ends_from_tokens",
  "tis_weights",
  "SHAPINGS",
  "ShapingInputs",
  "overlong_penalty",
  "DIVERGENCES",
  "CHUNK_THRESHOLD",
  "forward_kl_loss",
  "jsd_loss",
  "k1_loss",
  "k2_loss",
  "k3_loss",
  "reverse_kl_loss",
  "token_entropy",
  "token_forward_kl",
  "token_generalized_jsd",
  "token_reverse_kl",
]
