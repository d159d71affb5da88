"""The search stage (train/search.py): runs from a config with no gradient anywhere, its rounds
are summarised by the eval stage like RL steps, and a run stopped after its first round resumes
to the records of the uninterrupted run."""

import json
import os

import jax
import pytest

from posttrain_jax import methods
from posttrain_jax.sweeps import runner
from posttrain_jax.train import search

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _config(rule="corp"):
  c = runner.load_config_module(os.path.join(REPO, "experiments", "quickstart.py")).get_config(
    "smoke"
  )
  c.stages = ("pretrain", "search")
  c.progress = False
  c.search.update(
    rounds=2, population=8, prompts=8, val_prompts=16, eval_problems=16, sigma=0.01, rule=rule
  )
  return c


def _records(workdir):
  with open(os.path.join(workdir, "search", "metrics.jsonl")) as f:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")} for line in f]


@pytest.mark.slow
def test_search_runs_without_gradients_and_resumes_to_the_same_records(tmp_path, monkeypatch):
  def no_grad(*args, **kwargs):
    raise AssertionError("the search stage took a gradient")

  pre = _config()
  pre.stages = ("pretrain",)
  methods.run(pre, str(tmp_path / "base"))  # pretraining takes gradients; the search may not
  for name in ("full", "cut"):
    runner.link_shared_stages(str(tmp_path / "base"), str(tmp_path / name), ("pretrain",))
  monkeypatch.setattr(jax, "grad", no_grad)
  monkeypatch.setattr(jax, "value_and_grad", no_grad)
  evaluated = _config()
  evaluated.stages = ("pretrain", "search", "eval")
  evaluated.eval.rl_summary = ("search/accepted", "search/reward_std")
  methods.run(evaluated, str(tmp_path / "full"))
  full = _records(tmp_path / "full")
  assert [r["step"] for r in full] == [0, 1, 2]
  assert full[-1]["rollouts/total"] == 2 * (8 * 8 + 4 * 16)
  # The eval stage summarises the search's rounds as it does an RL stage's steps.
  with open(tmp_path / "full" / "summary.json") as f:
    summary = json.load(f)
  rounds = [r for r in full if "search/accepted" in r]
  assert summary["rl_sum/search/accepted"] == sum(r["search/accepted"] for r in rounds)
  assert summary["rl_mean/search/reward_std"] == pytest.approx(
    sum(r["search/reward_std"] for r in rounds) / len(rounds)
  )

  real = search.one_round

  def stop_at_second(*args, **kwargs):
    if args[-1] == 1:
      raise KeyboardInterrupt
    return real(*args, **kwargs)

  monkeypatch.setattr(search, "one_round", stop_at_second)
  with pytest.raises(KeyboardInterrupt):
    methods.run(_config(), str(tmp_path / "cut"))
  monkeypatch.setattr(search, "one_round", real)
  methods.run(_config(), str(tmp_path / "cut"))
  assert _records(tmp_path / "cut") == full


def test_bad_search_settings_are_named():
  from posttrain_jax.train import ConfigError

  c = _config(rule="best")
  with pytest.raises(ConfigError, match="search.rule='best' is unknown"):
    methods.validate(c)
  c = _config()
  c.search.population = 7
  with pytest.raises(ConfigError, match="must be even"):
    methods.validate(c)
