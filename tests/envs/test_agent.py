"""ToolEnv episodes on hand-written turns: exact observations, rewards, done flags, statuses and
counts; failing tools and verifiers as data; max_turns; step_all over a batch."""

import time

import pytest

from posttrain_jax import envs
from posttrain_jax.envs import agent, tools
from posttrain_jax.registry import ConfigError

ARITH = envs.ENVS["arithmetic"]
PROBLEM = ARITH.make(123, 456, 3)  # "123+456=", answer 579


def _info(status, turns, calls, failures, call=None, call_status=None):
  return {
    "status": status,
    "turns": turns,
    "tool_calls": calls,
    "tool_failures": failures,
    "call": call,
    "call_status": call_status,
  }


def test_an_episode_with_two_calls_then_the_answer():
  env = agent.ToolEnv(ARITH, ["calculator"])
  assert env.reset(PROBLEM) == "123+456="
  assert env.step("<tool>calculator(123+456)</tool>") == agent.StepResult(
    "<obs>579</obs>", 0.0, False, _info("running", 1, 1, 0, "calculator", "ok")
  )
  assert env.step("check <tool>calculator(579-456)</tool>") == agent.StepResult(
    "<obs>123</obs>", 0.0, False, _info("running", 2, 2, 0, "calculator", "ok")
  )
  assert env.step(" 579") == agent.StepResult("", 1.0, True, _info("ok", 3, 2, 0))


def test_a_wrong_final_answer_scores_zero_and_a_direct_one_scores():
  env = agent.ToolEnv(ARITH, ["calculator"])
  env.reset(PROBLEM)
  assert env.step("578") == agent.StepResult("", 0.0, True, _info("ok", 1, 0, 0))
  env.reset(PROBLEM)  # a new episode starts from zero counts
  assert env.step("579") == agent.StepResult("", 1.0, True, _info("ok", 1, 0, 0))


def test_malformed_calls_give_error_observations_and_the_episode_goes_on():
  env = agent.ToolEnv(ARITH, ["calculator"])
  env.reset(PROBLEM)
  assert env.step("<tool>abacus(1)</tool>") == agent.StepResult(
    "<obs>error: unknown tool 'abacus'; tools: calculator</obs>",
    0.0,
    False,
    _info("running", 1, 1, 1, None, "parse_error"),
  )
  assert env.step("<tool>calculator(123+456") == agent.StepResult(
    "<obs>error: <tool> without </tool> after it</obs>",
    0.0,
    False,
    _info("running", 2, 2, 2, None, "parse_error"),
  )
  assert env.step("<tool>calculator(x)</tool>") == agent.StepResult(
    "<obs>error: calculator: names are not allowed: x</obs>",
    0.0,
    False,
    _info("running", 3, 3, 3, "calculator", "error"),
  )
  assert env.step("579") == agent.StepResult("", 1.0, True, _info("ok", 4, 3, 3))


def _boom(args):
  raise RuntimeError(f"broken on {args}")


def _hang(args):
  time.sleep(5)
  return args


def _number(args):
  return 7


def test_raising_hanging_and_non_string_tools_are_observations():
  built = {
    "boom": tools.Tool("boom", _boom),
    "hang": tools.Tool("hang", _hang, timeout_s=0.1),
    "number": tools.Tool("number", _number),
  }
  env = agent.ToolEnv(ARITH, built, max_turns=4)
  env.reset(PROBLEM)
  start = time.monotonic()
  steps = [env.step(f"<tool>{name}(a)</tool>") for name in ("boom", "hang", "number")]
  assert time.monotonic() - start < 1.0
  assert [s.observation for s in steps] == [
    "<obs>error: boom raised RuntimeError: broken on a</obs>",
    "<obs>error: hang: timed out after 0.1 s</obs>",
    "<obs>error: number returned int, not text</obs>",
  ]
  assert [s.info["call_status"] for s in steps] == ["error", "timeout", "bad_output"]
  assert [s.done for s in steps] == [False, False, False]
  assert env.step("579") == agent.StepResult("", 1.0, True, _info("ok", 4, 3, 3))


def test_max_turns_ends_the_episode_with_its_status():
  env = agent.ToolEnv(ARITH, ["calculator"], max_turns=2)
  env.reset(PROBLEM)
  assert not env.step("<tool>calculator(1+1)</tool>").done
  assert env.step("<tool>calculator(2+2)</tool>") == agent.StepResult(
    "<obs>4</obs>", 0.0, True, _info("max_turns", 2, 2, 0, "calculator", "ok")
  )
  with pytest.raises(RuntimeError, match="call reset"):
    env.step("579")
  single = agent.ToolEnv(ARITH, ["calculator"], max_turns=1)
  single.reset(PROBLEM)
  assert single.step("579") == agent.StepResult("", 1.0, True, _info("ok", 1, 0, 0))


def test_max_tool_failures_ends_with_tool_error():
  env = agent.ToolEnv(ARITH, ["calculator"], max_tool_failures=2)
  env.reset(PROBLEM)
  assert not env.step("<tool>calculator(1/0)</tool>").done
  assert not env.step("<tool>calculator(1+1)</tool>").done
  assert env.step("<tool>calculator(y)</tool>") == agent.StepResult(
    "<obs>error: calculator: names are not allowed: y</obs>",
    0.0,
    True,
    _info("tool_error", 3, 3, 2, "calculator", "error"),
  )


def test_long_observations_are_cut():
  env = agent.ToolEnv(ARITH, ["calculator"], max_obs_chars=14)
  env.reset(PROBLEM)
  assert env.step("<tool>calculator(10**1)</tool>").observation == "<obs>error:...(cut)</obs>"
  assert env.step("<tool>calculator(99999*99999)</tool>").observation == "<obs>9999800001</obs>"


class _SlowVerifier:
  def verify(self, problem, text):
    time.sleep(5)
    return 1.0


class _BrokenVerifier:
  def verify(self, problem, text):
    raise KeyError(text)


class _TextVerifier:
  def verify(self, problem, text):
    return "yes"


def test_a_hanging_or_raising_verifier_is_a_status():
  env = agent.ToolEnv(_SlowVerifier(), ["calculator"], verify_timeout_s=0.1)
  env.reset(PROBLEM)
  assert env.step("579") == agent.StepResult("", 0.0, True, _info("env_timeout", 1, 0, 0))
  env = agent.ToolEnv(_BrokenVerifier(), ["calculator"])
  env.reset(PROBLEM)
  result = env.step("579")
  assert result == agent.StepResult(
    "", 0.0, True, dict(_info("env_error", 1, 0, 0), error="KeyError: '579'")
  )
  env = agent.ToolEnv(_TextVerifier(), ["calculator"])
  env.reset(PROBLEM)
  assert env.step("579").info["error"] == "ValueError: could not convert string to float: 'yes'"


def test_misuse_and_config_errors():
  env = agent.ToolEnv(ARITH, ["calculator"])
  with pytest.raises(RuntimeError, match="call reset"):
    env.step("579")
  env.reset(PROBLEM)
  with pytest.raises(TypeError, match="takes the turn's text, got int"):
    env.step(579)
  with pytest.raises(ConfigError, match="max_turns must be a positive integer, got 0"):
    agent.ToolEnv(ARITH, ["calculator"], max_turns=0)
  with pytest.raises(ConfigError, match="max_obs_chars=4 is below the cut mark"):
    agent.ToolEnv(ARITH, ["calculator"], max_obs_chars=4)
  with pytest.raises(ConfigError, match="needs a task env with verify"):
    agent.ToolEnv(object(), ["calculator"])
  with pytest.raises(ConfigError, match="unknown tool 'abacus'"):
    agent.ToolEnv(ARITH, ["abacus"])
  with pytest.raises(ConfigError, match="needs at least one tool"):
    agent.ToolEnv(ARITH, {})


def test_step_all_steps_the_active_rows_concurrently():
  built = {
    "calculator": tools.make_tool("calculator"),
    "nap": tools.Tool("nap", lambda a: time.sleep(0.5) or a),
  }
  rows = [agent.ToolEnv(ARITH, built) for _ in range(4)]
  for env in rows:
    env.reset(PROBLEM)
  start = time.monotonic()
  out = agent.step_all(rows, ["<tool>nap(a)</tool>", "<tool>nap(b)</tool>", None, "579"])
  assert time.monotonic() - start < 0.9  # the two naps overlapped (1.0 s in a row)
  assert [o and o.observation for o in out] == ["<obs>a</obs>", "<obs>b</obs>", None, ""]
  assert [o and o.done for o in out] == [False, False, None, True]
  assert out[3].reward == 1.0
  assert agent.step_all(rows[:1], [None]) == [None]
  with pytest.raises(ValueError, match="2 envs and 1 actions"):
    agent.step_all(rows[:2], ["579"])
