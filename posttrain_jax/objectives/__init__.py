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
                                                       remax, rloo)
from posttrain_jax.objectives.kl import KL_ESTIMATORS, entropy_from_logits, kl_k1, kl_k2, kl_k3
from posttrain_jax.objectives.pass_at_k import pass_at_k
from posttrain_jax.objectives.policy_losses import POLICY_LOSSES, ppo_clip, reinforce
from posttrain_jax.objectives.reductions import (AGGREGATIONS, Aggregate, aggregate, lookup,
                                                 masked_mean, masked_sum, masked_var,
                                                 masked_whiten)

ADVANTAGES.update(advantages_extra.EXTRA_ADVANTAGES)

__all__ = [
    "ADVANTAGES", "AGGREGATIONS", "AdvantageInputs", "Aggregate", "KL_ESTIMATORS", "POLICY_LOSSES", "aggregate",
    "dr_grpo", "entropy_from_logits", "grpo", "kl_k1", "kl_k2", "kl_k3", "lookup", "masked_mean",
    "masked_sum", "masked_var", "masked_whiten", "pass_at_k", "ppo_clip", "reinforce",
    "VALUE_LOSSES", "gae_advantages", "gndpo", "max_at_k", "maxpo", "opd",
    "pass_at_k_advantages", "reinforce_pp", "reinforce_pp_baseline", "remax", "rloo",
]
