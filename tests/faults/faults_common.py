"""What the fault-injection tests share: the quickstart's smoke config with sections applied."""

import os

from posttrain_jax.sweeps.reproduce import load_config_module

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def smoke_config(**sections):
  """The quickstart's smoke config (progress off) with ``sections`` applied: a dict updates
  that section (``rl={"lr": 1e-2}``), anything else replaces the key (``stages=("rl",)``)."""
  c = load_config_module(os.path.join(REPO, "experiments", "quickstart.py")).get_config("smoke")
  c.progress = False
  for name, value in sections.items():
    if isinstance(value, dict):
      c[name].update(value)
    else:
      c[name] = value
  return c
