"""Methods that are more than one registry entry, one folder each (DESIGN.md section 4), and
the ``METHODS`` table the engine is handed.

Each folder holds a method's host logic and its :class:`~posttrain_jax.train.hooks.Method`
record (config check, builders, run-state slots, hooks at fixed phases of the one generic RL
step); its pure math stays in ``objectives/`` or ``rollout/``. The engine (``train/``) imports
nothing from here: :func:`run`, :func:`make_context` and :func:`validate` hand it the table.
The table's order is the order in which the engine calls the hooks of one phase.

Adding a method: docs/architecture.md ("Adding a method", SAVE as the worked example).
"""

from posttrain_jax.methods import (
  agent,
  critic,
  denoise,
  gkd,
  pass_band,
  pr2,
  remax,
  rollout_dump,
  save,
  sft_mix,
  teacher,
  welfare,
)
from posttrain_jax.train import context as _context
from posttrain_jax.train import experiment as _experiment
from posttrain_jax.train import hooks as _hooks
from posttrain_jax.train import validate as _validate

# In phase order within a step: the teacher's phase sets the loss weights before another
# method's before_update and its copy is refreshed first after the update; GKD may replace the
# rollouts by the reference answers before SAVE's reward model scores them; the critic's
# update comes before SAVE's reward model's.
METHODS = (
  teacher.METHOD,
  gkd.METHOD,
  critic.METHOD,
  save.METHOD,
  denoise.METHOD,
  remax.METHOD,
  sft_mix.METHOD,
  agent.METHOD,
  pr2.METHOD,
  welfare.METHOD,
  pass_band.METHOD,
  rollout_dump.METHOD,  # last: it writes the rollouts as the other methods left them
)
_hooks.check_table(METHODS)


def run(config, workdir, **kwargs) -> dict:
  """``train.experiment.run`` with the METHODS table (what ``main.py`` runs)."""
  return _experiment.run(config, workdir, methods=METHODS, **kwargs)


def make_context(config, workdir, **kwargs):
  """``train.context.make_context`` with the METHODS table."""
  return _context.make_context(config, workdir, methods=METHODS, **kwargs)


def validate(config) -> None:
  """``train.validate.validate`` with the METHODS table."""
  _validate.validate(config, methods=METHODS)


__all__ = [
  "METHODS",
  "critic",
  "denoise",
  "gkd",
  "make_context",
  "pass_band",
  "pr2",
  "remax",
  "rollout_dump",
  "run",
  "save",
  "sft_mix",
  "validate",
]
