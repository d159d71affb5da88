"""rewards/calls.py and rewards/outcomes.py: every failure kind scores 0 and is counted, the first
of each kind is printed once, a hanging reward costs its timeout, the worker pool gives the same
rewards as calling the envs in this process, and every registered env pickles."""

import io
import math
import os
import pickle
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from posttrain_jax import envs
from posttrain_jax.methods import validate
from posttrain_jax.registry import ConfigError, TrainingError
from posttrain_jax.rewards import calls, outcomes

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "faults"))
import faults_rewards_helpers as helpers  # noqa: E402

CODE = outcomes.CODES
PROBLEM = envs.Problem(prompt="12+30=", answer="42", env="arithmetic", level=2, uid="a:12+30")


@pytest.mark.parametrize(
  "value, reward, code",
  [
    (1, 1.0, 0),
    (0.25, 0.25, 0),
    (True, 1.0, 0),
    (np.float32(0.5), 0.5, 0),
    (np.array([[2.0]]), 2.0, 0),
    (jax.numpy.asarray(0.75), 0.75, 0),
    (math.nan, 0.0, CODE["nonfinite"]),
    (-math.inf, 0.0, CODE["nonfinite"]),
    (np.array(np.inf), 0.0, CODE["nonfinite"]),
    ("1.0", 0.0, CODE["non_numeric"]),
    (None, 0.0, CODE["non_numeric"]),
    (b"1", 0.0, CODE["non_numeric"]),
    (1j, 0.0, CODE["non_numeric"]),
    (np.array([1.0, 0.0]), 0.0, CODE["non_numeric"]),
    ([1.0], 0.0, CODE["non_numeric"]),
    (np.array(["1"]), 0.0, CODE["non_numeric"]),
  ],
)
def test_judge(value, reward, code):
  out = outcomes.judge(value)
  assert (out.reward, out.code) == (reward, code) and type(out.reward) is float


def _scorer(workers=2, timeout=0.5, max_error_rate=0.5):
  out = io.StringIO()
  return calls.Scorer(timeout=timeout, workers=workers, max_error_rate=max_error_rate, out=out), out


@pytest.mark.parametrize("workers", [2, 0])
def test_every_kind_scores_zero_is_counted_and_warned_once(workers):
  modes = ["ok", "raise", "nan", "string", "none", "inf", "array", "raise", "ok", "string"]
  scorer, out = _scorer(workers)
  rewards, codes = scorer.score(
    helpers.BrokenReward(envs.ENVS["arithmetic"], "by_text"),
    [PROBLEM] * len(modes),
    modes,
    env="arithmetic",
  )
  expect = [
    0,
    CODE["raised"],
    CODE["nonfinite"],
    CODE["non_numeric"],
    CODE["non_numeric"],
    CODE["nonfinite"],
    CODE["non_numeric"],
    CODE["raised"],
    0,
    CODE["non_numeric"],
  ]
  assert codes.tolist() == expect
  assert rewards.tolist() == [0.0] * len(modes)  # "ok" != "42": a real 0 reward
  assert rewards.dtype == np.float32
  assert outcomes.counts(codes) == {
    "reward/errors/raised": 2.0,
    "reward/errors/timeout": 0.0,
    "reward/errors/nonfinite": 2.0,
    "reward/errors/non_numeric": 4.0,
  }
  lines = out.getvalue().splitlines()
  if not workers:
    assert lines.pop(0) == (
      "warning: config.reward.workers=0 scores rewards in this process; "
      "config.reward.timeout is not enforced (a reward that hangs hangs "
      "the run)"
    )
  assert lines == [
    "warning: reward of env 'arithmetic' failed (raised) on problem 'a:12+30' (prompt "
    "'12+30='), completion 'raise': ZeroDivisionError: cannot score 'raise'; scored 0 and "
    "counted in reward/errors/raised (shown once per kind)",
    "warning: reward of env 'arithmetic' failed (nonfinite) on problem 'a:12+30' (prompt "
    "'12+30='), completion 'nan': returned nan; scored 0 and counted in "
    "reward/errors/nonfinite (shown once per kind)",
    "warning: reward of env 'arithmetic' failed (non_numeric) on problem 'a:12+30' (prompt "
    "'12+30='), completion 'string': returned '1.0' (str), not a number; scored 0 and "
    "counted in reward/errors/non_numeric (shown once per kind)",
  ]
  scorer.score(
    helpers.BrokenReward(envs.ENVS["arithmetic"], "raise"), [PROBLEM], ["x"], env="arithmetic"
  )
  assert len(out.getvalue().splitlines()) == len(lines) + (0 if workers else 1)  # once a run


@pytest.mark.parametrize("mode", ["sleep", "busy", "ignore_alarm", "exit"])
def test_a_hanging_or_dying_reward_costs_its_timeout_and_the_rest_is_scored(mode):
  scorer, out = _scorer(workers=2, timeout=0.5)
  env = helpers.BrokenReward(envs.ENVS["arithmetic"], "by_text")
  scorer.score(env, [PROBLEM], ["ok"], env="arithmetic")  # workers up and holding the env
  texts = ["ok", mode, "ok", "nan", mode, "ok"]
  start = time.monotonic()
  rewards, codes = scorer.score(env, [PROBLEM] * len(texts), texts, env="arithmetic")
  wall = time.monotonic() - start
  kind = CODE["raised"] if mode == "exit" else CODE["timeout"]
  assert codes.tolist() == [0, kind, 0, CODE["nonfinite"], kind, 0]
  assert rewards.tolist() == [0.0] * 6
  # the two bad calls run on the two workers side by side: 0.5 s each (+ GRACE when the alarm
  # is ignored and the parent kills the worker), never the 1e6 s of the reward
  bound = 0.5 + calls.GRACE + 10 if mode == "ignore_alarm" else 10
  assert wall < bound, wall
  detail = (
    "the reward's worker process died (exit 3)" if mode == "exit" else "no result within 0.5 s"
  )
  assert detail in out.getvalue()
  again, codes = scorer.score(env, [PROBLEM] * 2, ["ok", "ok"], env="arithmetic")
  assert codes.tolist() == [0, 0]  # the replaced workers answer


def test_error_rate_stop_names_env_kinds_counts_and_key():
  scorer, _ = _scorer(max_error_rate=0.25)
  codes = np.array([CODE["raised"], CODE["timeout"], 0, 0, 0, 0, 0, 0], np.int32)
  scorer.check(codes, where="rl step 3", env="countdown")  # 2 of 8 = 0.25: not above
  codes[2] = CODE["raised"]
  with pytest.raises(TrainingError) as e:
    scorer.check(codes, where="rl step 3", env="countdown")
  assert str(e.value) == (
    "rl step 3: 3 of 8 reward calls of env 'countdown' failed (raised 2, timeout 1), above "
    "config.reward.max_error_rate=0.25; fix the env's reward (the first failure of each "
    "kind was printed above), raise config.reward.timeout, or raise "
    "config.reward.max_error_rate (1.0 never stops)"
  )
  mask = np.array([0, 1, 0, 1, 1, 1, 1, 1])  # padding rows do not count: 1 of 6
  scorer.check(codes, mask, where="rl step 3", env="countdown")
  _scorer(max_error_rate=1.0)[0].check(np.full(4, CODE["nonfinite"]), where="x", env="y")


def _only_here(pid):
  if os.getpid() != pid:
    raise ImportError("no module named 'mine'")
  return _Unloadable()


class _Unloadable:
  """Pickles here, cannot be unpickled in a worker (as a class of an unimportable module)."""

  def __reduce__(self):
    return _only_here, (os.getpid(),)

  def verify(self, problem, completion):
    return 1.0


@pytest.mark.parametrize("where", ["here", "worker"])
def test_an_env_that_does_not_pickle_is_one_config_error(where):
  class Local:
    def verify(self, problem, completion):
      return 1.0

  env = Local() if where == "here" else _Unloadable()
  scorer, _ = _scorer()
  with pytest.raises(ConfigError) as e:
    scorer.score(env, [PROBLEM], ["42"], env="mine")
  why = (
    "it does not pickle: AttributeError: Can't pickle local object "
    if where == "here"
    else "a worker cannot unpickle it: ImportError: no module named 'mine'"
  )
  assert str(e.value).startswith(
    f"the reward of env 'mine' cannot be sent to the reward worker processes ({why}"
  )
  assert str(e.value).endswith(
    "; define the env's class at module level of an importable "
    "module, or set config.reward.workers=0 to score in this "
    "process (no timeout)"
  )
  rewards, codes = _scorer(workers=0)[0].score(env, [PROBLEM], ["42"], env="mine")
  assert (rewards.tolist(), codes.tolist()) == ([1.0], [0])  # the advice works


def _cases(env, level):
  """Problems of ``env`` with their answer, a wrong answer and junk as completions."""
  problems = env.sample(jax.random.key(3), 6, level=level, split="train")
  pairs = [(p, t) for p in problems for t in (p.answer, p.answer + "1", "", " " + p.answer)]
  return [p for p, _ in pairs], [t for _, t in pairs]


def test_every_env_pickles_and_the_pool_scores_as_in_process(tmp_path):
  """Every registered env and a static dataset: the workers' rewards equal ``env.verify`` here,
  bit for bit."""
  dataset = str(tmp_path / "d.jsonl")
  envs.static.write_dataset(dataset, "countdown", jax.random.key(0), 8, level=3)
  table = [(name, env, env.levels[0]) for name, env in sorted(envs.ENVS.items())]
  table.append(("static", envs.StaticDataset(dataset), None))
  pooled, _ = _scorer(workers=2, timeout=10.0)
  for name, env, level in table:
    clone = pickle.loads(pickle.dumps(env))
    problems, texts = (
      _cases(env, level)
      if level is not None
      else (
        env.problems * 2,
        [p.answer for p in env.problems] + [p.answer + "1" for p in env.problems],
      )
    )
    direct = np.asarray([env.verify(p, t) for p, t in zip(problems, texts)], np.float32)
    assert np.array_equal(direct, [clone.verify(p, t) for p, t in zip(problems, texts)]), name
    rewards, codes = pooled.score(env, problems, texts, env=name)
    assert np.array_equal(rewards, direct) and not codes.any(), name
  assert direct.sum() > 0


def test_a_script_without_a_main_guard_runs_once(tmp_path):
  """The workers do not re-run the parent's ``__main__`` (multiprocessing's default for
  forkserver and spawn children): a script that scores at top level prints once, exits 0."""
  script = tmp_path / "score.py"
  script.write_text(
    'print("RAN", flush=True)\n'
    "from posttrain_jax import envs\n"
    "from posttrain_jax.rewards import calls\n"
    'p = envs.Problem(prompt="1+1=", answer="2", env="arithmetic", level=1, uid="u")\n'
    "s = calls.Scorer(timeout=5.0, workers=2, max_error_rate=0.5)\n"
    'print(s.score(envs.ENVS["arithmetic"], [p, p], ["2", "3"], env="arithmetic")[0].tolist())\n'
  )
  out = subprocess.run(
    [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False
  )
  assert (out.returncode, out.stdout.splitlines()) == (0, ["RAN", "[1.0, 0.0]"]), out.stderr


@pytest.mark.parametrize(
  "key, value, message",
  [
    ("timeout", 0, "config.reward.timeout must be a number > 0, got 0"),
    (
      "timeout",
      math.inf,
      "config.reward.timeout must be a finite number of seconds "
      "(config.reward.workers=0 scores without a timeout), got inf",
    ),
    ("timeout", "5", "config.reward.timeout must be a number > 0, got '5'"),
    ("workers", -1, "config.reward.workers must be an integer >= 0, got -1"),
    ("workers", 1.5, "config.reward.workers must be an integer >= 0, got 1.5"),
    ("max_error_rate", 1.5, "config.reward.max_error_rate must be a number in [0, 1], got 1.5"),
    ("max_error_rate", -0.1, "config.reward.max_error_rate must be a number in [0, 1], got -0.1"),
  ],
)
def test_reward_settings_are_validated(key, value, message):
  config = helpers.smoke_config()
  validate(config)  # the defaults pass
  config.reward = {**config.reward.to_dict(), key: value}  # as an experiment file may write it
  with pytest.raises(ConfigError) as e:
    validate(config)
  assert str(e.value) == message


def test_an_interrupted_batch_leaves_no_stale_answers(monkeypatch):
  """Ctrl-C while the workers score: they are stopped, so the next batch never reads the
  interrupted batch's answers."""
  scorer, _ = _scorer(workers=2, timeout=5.0)
  env = helpers.BrokenReward(envs.ENVS["arithmetic"], "ok")
  scorer.score(env, [PROBLEM], ["42"], env="arithmetic")

  wait, first = calls.multiprocessing.connection.wait, []

  def interrupted(*args, **kwargs):  # the parent's first wait for answers; later ones work
    if not first:
      first.append(True)
      raise KeyboardInterrupt
    return wait(*args, **kwargs)

  with monkeypatch.context() as m:
    m.setattr(calls.multiprocessing.connection, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
      scorer.score(env, [PROBLEM] * 4, ["42", "1", "42", "1"], env="arithmetic")
  rewards, codes = scorer.score(env, [PROBLEM] * 4, ["1", "42", "1", "42"], env="arithmetic")
  assert rewards.tolist() == [0.0, 1.0, 0.0, 1.0] and codes.tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("workers", [2, 0])
def test_a_reward_function_is_scored_like_an_env(workers):
  rewards, codes = _scorer(workers)[0].score(
    helpers.exact, [PROBLEM] * 3, ["42", "4", "42 "], env="exact"
  )
  assert rewards.tolist() == [1.0, 0.0, 0.0] and codes.tolist() == [0, 0, 0]
