"""Pure math of RL post-training: advantages, policy losses, KL, entropy, reductions.

Arrays in, arrays out: nothing here sees a model, a tokenizer or a config. Pieces are looked up
by name in plain dicts (``ADVANTAGES``, ``POLICY_LOSSES``, ``KL_ESTIMATORS``, ``AGGREGATIONS``).
"""

from posttrain_jax.objectives import advantages_extra
from posttrain_jax.objectives.advantages import ADVANTAGES, AdvantageInputs, dr_grpo, grpo
from posttrain_jax.objectives.advantages_extra import (VALUE_LOSSES, gae_advantages, gndpo,
                                                       max_at_k, maxpo, opd)
from posttrain_jax.objectives.advantages_extra import pass_at_k as pass_at_k_advantages
from posttrain_jax.objectives.advantages_extra import (reinforce_pp, reinforce_pp_baseline,
                                                       remax, rloo, terminal_rewards)
from posttrain_jax.objectives import policy_losses_extra
from posttrain_jax.objectives.policy_losses_extra import a_hpo_beta
from posttrain_jax.objectives.auxiliary import AUX_LOSSES, echo_clip_loss, step_ends_from_tokens
from posttrain_jax.objectives.constraints import (CONTROLLERS, AHPOState, DCMDPState,
                                                  KLControllerState, a_hpo_init, a_hpo_update,
                                                  adaptive_kl_controller, dcmdp_term,
                                                  dcmdp_update, full_kl)
from posttrain_jax.objectives.mismatch import (IS_CORRECTIONS, mis_weights, mismatch_metrics,
                                               tis_weights)
from posttrain_jax.objectives.kl import KL_ESTIMATORS, entropy_from_logits, kl_k1, kl_k2, kl_k3
from posttrain_jax.objectives.pass_at_k import pass_at_k
from posttrain_jax.objectives.shaping import SHAPINGS, ShapingInputs, overlong_penalty
from posttrain_jax.objectives.policy_losses import POLICY_LOSSES, ppo_clip, reinforce
from posttrain_jax.registry import lookup
from posttrain_jax.objectives.reductions import (AGGREGATIONS, Aggregate, aggregate,
                                                 masked_mean, masked_sum, masked_var,
                                                 masked_whiten)

ADVANTAGES.update(advantages_extra.EXTRA_ADVANTAGES)
POLICY_LOSSES.update(policy_losses_extra.EXTRA_POLICY_LOSSES)

__all__ = [
    "ADVANTAGES", "AGGREGATIONS", "AdvantageInputs", "Aggregate", "KL_ESTIMATORS", "POLICY_LOSSES", "aggregate",
    "dr_grpo", "entropy_from_logits", "grpo", "kl_k1", "kl_k2", "kl_k3", "lookup", "masked_mean",
    "masked_sum", "masked_var", "masked_whiten", "pass_at_k", "ppo_clip", "reinforce",
    "VALUE_LOSSES", "gae_advantages", "gndpo", "max_at_k", "maxpo", "opd",
    "pass_at_k_advantages", "reinforce_pp", "reinforce_pp_baseline", "remax", "rloo",
    "terminal_rewards", "AUX_LOSSES", "CONTROLLERS", "DCMDPState", "IS_CORRECTIONS",
    "KLControllerState", "AHPOState", "a_hpo_beta", "a_hpo_init", "a_hpo_update",
    "adaptive_kl_controller", "dcmdp_term", "dcmdp_update", "echo_clip_loss", "full_kl",
    "mis_weights", "mismatch_metrics", "step_ends_from_tokens", "tis_weights",
    "SHAPINGS", "ShapingInputs", "overlong_penalty",
]
