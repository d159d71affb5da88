"""Issue 21, rewards on the current path (in-process runs of the smoke config's RL stage): a
reward that raises, returns NaN or hangs scores 0 and is counted in the RL and eval records, its
first failure is printed once, the run goes on, and above config.reward.max_error_rate it stops
with one message whose advice, followed in the same workdir, finishes the run."""

import json
import math
import time

import faults_rewards_helpers as helpers
import pytest

from posttrain_jax import envs
from posttrain_jax import methods as methods_lib
from posttrain_jax.registry import TrainingError
from posttrain_jax.train import async_rollouts

KINDS = ("raised", "timeout", "nonfinite", "non_numeric")
ROWS = 16  # the smoke config's 4 prompts x 4 rollouts; also its RL evaluation's problems


@pytest.fixture
def reward_mode(monkeypatch):
  """``reward_mode(mode)``: every env's verify replaced by ``helpers.MODES[mode]``."""
  get_env = envs.get_env

  def use(mode):
    monkeypatch.setattr(envs, "get_env", lambda name: helpers.BrokenReward(get_env(name), mode))

  return use


def _errors(record, prefix=""):
  return {k: record[f"{prefix}reward/errors/{k}"] for k in KINDS}


def _expect(kind, n):
  return {k: float(n if k == kind else 0) for k in KINDS}


def _warnings(err, kind):
  return [
    l
    for l in err.splitlines()
    if l.startswith("warning: reward of env ") and f"failed ({kind})" in l
  ]


def test_nan_reward_stops_the_step_then_the_advised_rerun_counts_it(tmp_path, reward_mode, capsys):
  reward_mode("nan")
  with pytest.raises(TrainingError) as e:
    methods_lib.run(helpers.smoke_config(), str(tmp_path))
  assert str(e.value) == (
    "rl step 1: 16 of 16 reward calls of env 'arithmetic' failed (nonfinite 16), above "
    "config.reward.max_error_rate=0.5; fix the env's reward (the first failure of each kind "
    "was printed above), or raise config.reward.max_error_rate (1.0 never stops)"
  )
  first = capsys.readouterr().err
  assert len(_warnings(first, "nonfinite")) == 1
  # the advice: raise config.reward.max_error_rate; the same workdir finishes, NaN scored 0
  methods_lib.run(helpers.smoke_config(max_error_rate=1.0), str(tmp_path))
  records = [r for r in helpers.records(tmp_path) if r["step"] > 0]
  assert [r["step"] for r in records] == [1, 2]
  for r in records:
    assert _errors(r) == _expect("nonfinite", ROWS) and r["reward/errors"] == ROWS
    assert r["reward/mean"] == 0.0 and r["train/skipped"] == 0.0
    assert all(not (isinstance(v, float) and math.isnan(v)) for v in r.values()), r
  (line,) = _warnings(capsys.readouterr().err, "nonfinite")
  assert line.startswith("warning: reward of env 'arithmetic' failed (nonfinite) on problem ")
  assert line.endswith(
    ": returned nan; scored 0 and counted in reward/errors/nonfinite (shown once per kind)"
  )


def test_raising_reward_in_evaluation_stops_then_training_and_evaluation_count_it(
  tmp_path, reward_mode, capsys
):
  reward_mode("raise")
  with pytest.raises(TrainingError) as e:  # the step-0 evaluation comes first
    methods_lib.run(helpers.smoke_config(eval_every=2), str(tmp_path))
  assert str(e.value) == (
    "evaluation (eval/*): 16 of 16 reward calls of env 'arithmetic' failed (raised 16), "
    "above config.reward.max_error_rate=0.5; fix the env's reward (the first failure of "
    "each kind was printed above), or raise config.reward.max_error_rate (1.0 never stops)"
  )
  assert len(_warnings(capsys.readouterr().err, "raised")) == 1
  config = helpers.smoke_config(eval_every=2, max_error_rate=1.0)
  config.stages = ("rl", "eval")
  methods_lib.run(config, str(tmp_path))
  records = helpers.records(tmp_path)
  assert [r["step"] for r in records] == [0, 1, 2]
  evals = [r for r in records if "eval/accuracy" in r]
  assert [r["step"] for r in evals] == [0, 2]
  for r in evals:  # was a KeyError traceback
    assert _errors(r, "eval/") == _expect("raised", ROWS) and r["eval/accuracy"] == 0.0
  for r in records[1:]:
    assert _errors(r) == _expect("raised", ROWS) and r["reward/mean"] == 0.0
  with open(tmp_path / "summary.json", encoding="utf-8") as f:
    summary = json.load(f)
  # the eval stage: 32 greedy + 8 x 4 sampled calls for each of the policies it evaluates
  assert summary["reward_errors_after_rl"] == 64.0 and summary["accuracy_after_rl"] == 0.0
  assert all(v == 64.0 for k, v in summary.items() if k.startswith("reward_errors_"))
  (line,) = _warnings(capsys.readouterr().err, "raised")  # once, training and eval together
  assert ": ZeroDivisionError: cannot score " in line


def test_hanging_reward_costs_its_timeout_and_the_run_goes_on(tmp_path, reward_mode, capsys):
  reward_mode("sleep")  # time.sleep(1e6) in every call
  start = time.monotonic()
  methods_lib.run(helpers.smoke_config(steps=1, timeout=0.25, max_error_rate=1.0), str(tmp_path))
  wall = time.monotonic() - start
  (record,) = [r for r in helpers.records(tmp_path) if r["step"] > 0]
  assert _errors(record) == _expect("timeout", ROWS) and record["reward/mean"] == 0.0
  # 16 calls on 2 workers: 8 x 0.25 s of timeouts, plus building and compiling the run
  assert wall < 300, wall
  (line,) = _warnings(capsys.readouterr().err, "timeout")
  assert line.endswith(
    ": no result within 0.25 s; scored 0 and counted in reward/errors/timeout (shown once per kind)"
  )


def test_the_stop_in_the_async_producer_reaches_the_trainer_as_itself():
  """With config.rl.async_rollouts the scoring runs in the producer thread: its stop is the
  same TrainingError (one line from main), not a wrapped ProducerError traceback."""
  stop = TrainingError("rl step 3: 16 of 16 reward calls of env 'arithmetic' failed")

  def generate(params, version, n):
    raise stop

  with async_rollouts.RolloutProducer(generate, queue_size=1, max_staleness=1) as producer:
    producer.publish("p", 0)
    producer.start()
    with pytest.raises(TrainingError) as e:
      producer.get(0, timeout=10)
  assert e.value is stop
