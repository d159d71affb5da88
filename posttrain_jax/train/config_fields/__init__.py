"""Every config key, declared once (``posttrain_jax.fields``): its default, doc, numeric kind and
the first stage a change reruns, beside each other in its section. ``ROOT`` is the whole
config; the default config (``posttrain_jax.defaults.base_config``), the ranges
(``train.config_ranges``), the rerun table (``train.workdir``) and docs/config.md's key table
are derived from it (tests/test_docs.py checks the docs).

Files: ``run`` (the run's own keys, the env, the model, the reward calls, the meshes),
``pretrain``, ``sft``, ``preference``, ``rl``, ``search``, ``evaluation``, ``reward_model``. A method's section is declared in its
folder (``methods/<name>/fields.py``, ``Method.fields``); ``train.hooks.config_root(methods)``
is the whole config's declaration.
"""

from posttrain_jax.fields import Section, flatten
from posttrain_jax.train.config_fields.evaluation import EVAL
from posttrain_jax.train.config_fields.preference import PREFERENCE
from posttrain_jax.train.config_fields.pretrain import PRETRAIN
from posttrain_jax.train.config_fields.reward_model import REWARD_MODEL
from posttrain_jax.train.config_fields.rl import RL
from posttrain_jax.train.config_fields.run import RUN
from posttrain_jax.train.config_fields.search import SEARCH
from posttrain_jax.train.config_fields.sft import SFT

ROOT = Section(
  "the experiment config",
  stage="pretrain",
  fields=dict(
    RUN,
    pretrain=PRETRAIN,
    sft=SFT,
    preference=PREFERENCE,
    rl=RL,
    search=SEARCH,
    eval=EVAL,
    reward_model=REWARD_MODEL,
  ),
)

KEYS = flatten(
  ROOT
)  # "rl.lr" -> fields.Key (the engine's keys; hooks.config_root adds the methods')

__all__ = ["KEYS", "ROOT"]
