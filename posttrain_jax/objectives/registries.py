"""The package registries of named pieces, each built once here from the files that define them.

Every file of ``objectives`` keeps a plain dict of its own entries under the registry's name
(``group_baselines.ADVANTAGES``, ``value.ADVANTAGES``, ``ppo_family.POLICY_LOSSES``, ...).
:data:`SOURCES` lists, per registry, the files whose dicts it merges, and :func:`merge` builds
each registry as their union, raising at import when two files define the same name. Nothing
mutates a registry on import; ``objectives/__init__.py`` re-exports the merged dicts.

Adding a piece: a function and an entry in its file's dict. Adding a file with entries of an
existing kind: its dict and its module in :data:`SOURCES`.
"""

from types import ModuleType
from typing import Callable

from posttrain_jax.objectives import (
  auxiliary,
  controllers,
  covariance,
  distillation,
  divergences,
  group_baselines,
  hysteretic,
  kl,
  mismatch,
  pass_at_k_family,
  perturbation,
  ppo_family,
  preference,
  reductions,
  sequence_level,
  shaping,
  state_values,
  value,
)

# Registry name -> the modules holding a dict of that name, in merge order.
SOURCES: dict[str, tuple[ModuleType, ...]] = {
  "ADVANTAGES": (group_baselines, value, pass_at_k_family, distillation, state_values),
  "POLICY_LOSSES": (ppo_family, sequence_level, hysteretic, covariance),
  "KL_ESTIMATORS": (kl,),
  "AGGREGATIONS": (reductions,),
  "AUX_LOSSES": (auxiliary,),
  "IS_CORRECTIONS": (mismatch,),
  "CONTROLLERS": (controllers,),
  "VALUE_LOSSES": (value,),
  "SHAPINGS": (shaping,),
  "DIVERGENCES": (divergences,),
  "PREFERENCE_LOSSES": (preference,),
  "CONSOLIDATIONS": (perturbation,),
}


def merge(kind: str, modules) -> dict[str, Callable]:
  """A new dict: the union of ``module.<kind>`` over ``modules``, in order.

  Raises:
    ValueError: a name is defined by two of the modules (the message names both).
  """
  out, owner = {}, {}
  for module in modules:
    for name, piece in getattr(module, kind).items():
      if name in owner:
        raise ValueError(
          f"{kind}: {name!r} is defined twice, in {owner[name]} and in "
          f"{module.__name__}; registry names must be unique, rename one"
        )
      out[name] = piece
      owner[name] = module.__name__
  return out


ADVANTAGES = merge("ADVANTAGES", SOURCES["ADVANTAGES"])
POLICY_LOSSES = merge("POLICY_LOSSES", SOURCES["POLICY_LOSSES"])
KL_ESTIMATORS = merge("KL_ESTIMATORS", SOURCES["KL_ESTIMATORS"])
AGGREGATIONS = merge("AGGREGATIONS", SOURCES["AGGREGATIONS"])
AUX_LOSSES = merge("AUX_LOSSES", SOURCES["AUX_LOSSES"])
IS_CORRECTIONS = merge("IS_CORRECTIONS", SOURCES["IS_CORRECTIONS"])
CONTROLLERS = merge("CONTROLLERS", SOURCES["CONTROLLERS"])
VALUE_LOSSES = merge("VALUE_LOSSES", SOURCES["VALUE_LOSSES"])
SHAPINGS = merge("SHAPINGS", SOURCES["SHAPINGS"])
DIVERGENCES = merge("DIVERGENCES", SOURCES["DIVERGENCES"])
PREFERENCE_LOSSES = merge("PREFERENCE_LOSSES", SOURCES["PREFERENCE_LOSSES"])
CONSOLIDATIONS = merge("CONSOLIDATIONS", SOURCES["CONSOLIDATIONS"])
