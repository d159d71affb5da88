"""Fixtures shared by the RL-loop tests."""

import pytest
import rl_fixtures as fx

from posttrain_jax import envs


@pytest.fixture
def coin_env(monkeypatch):
  """Every env's verifier replaced by a coin flip (``rl_fixtures.CoinEnv``), so a random smoke
  model's groups have reward variance."""
  get_env = envs.get_env
  monkeypatch.setattr(envs, "get_env", lambda name: fx.CoinEnv(get_env(name)))
