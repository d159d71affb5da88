"""Multi-turn agent environments: the ``AgentEnv`` protocol, ``ToolEnv`` and ``step_all``.

An episode is ``reset(problem) -> prompt``, then ``step(action_text) -> StepResult`` once per
model turn. :class:`ToolEnv` runs the tool a turn calls (``<tool>name(args)</tool>``,
envs/tool_calls.py) and answers with the observation text to append (``<obs>...</obs>``); a turn
without a call is the final answer, scored by the task's verifier. Whatever goes wrong in a step
(a malformed call, a tool that raises or hangs, a verifier that hangs) is data: an error
observation or an episode status, never an exception out of ``step``.
"""

import concurrent.futures
import dataclasses
from typing import Protocol, Sequence

from posttrain_jax.envs import base, tool_calls
from posttrain_jax.envs import tools as tools_lib
from posttrain_jax.registry import ConfigError

STATUSES = ("running", "ok", "max_turns", "tool_error", "env_timeout", "env_error")
DEFAULT_MAX_TURNS = 5
DEFAULT_MAX_OBS_CHARS = 256
DEFAULT_VERIFY_TIMEOUT_S = 30.0


@dataclasses.dataclass(frozen=True)
class StepResult:
  """What one step gave.

  Attributes:
    observation: text to append after the action ('' when the episode ended on an answer).
    reward: the verifier's score on the final answer; 0.0 before the end and on a failed end.
    done: whether the episode has ended.
    info: ``status`` (one of ``STATUSES``), ``turns``, ``tool_calls``, ``tool_failures``,
      ``call`` (the tool this turn called, or None) and ``call_status`` (``"ok"``,
      ``"parse_error"``, a :class:`~posttrain_jax.envs.tools.ToolOutput` status, or None).
  """

  observation: str
  reward: float
  done: bool
  info: dict


class AgentEnv(Protocol):
  """The multi-turn env contract the rollout loop drives."""

  def reset(self, problem: base.Problem) -> str:
    """Starts an episode on ``problem``; returns the first text the model continues."""

  def step(self, action_text: str) -> StepResult:
    """Takes the model's turn; returns the observation, reward, done flag and info."""


def _check_positive(name: str, value, integer: bool = False) -> None:
  kind = int if integer else (int, float)
  if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
    raise ConfigError(
      f"ToolEnv {name} must be a positive {'integer' if integer else 'number'}, got {value!r}"
    )


class ToolEnv:
  """A task env (``verify(problem, text) -> float``) played over turns with tools.

  Each turn's action either calls a tool (the last call in it counts; the observation is the
  tool's text or an error) or is the final answer (no call tag): the episode then ends with the
  verifier's score on the text after the last observation, status ``ok``. The episode also
  ends after ``max_turns`` turns without an answer (status ``max_turns``, reward 0), after
  ``max_tool_failures`` failed calls when set (``tool_error``, reward 0), when the verifier
  does not return within ``verify_timeout_s`` (``env_timeout``, reward 0) or when it raises
  (``env_error``, reward 0, ``info["error"]`` the exception).
  """

  def __init__(
    self,
    task,
    tools,
    *,
    max_turns: int = DEFAULT_MAX_TURNS,
    max_obs_chars: int = DEFAULT_MAX_OBS_CHARS,
    max_tool_failures: int | None = None,
    verify_timeout_s: float = DEFAULT_VERIFY_TIMEOUT_S,
  ):
    """``tools``: name -> :class:`~posttrain_jax.envs.tools.Tool`, or specs for
    :func:`~posttrain_jax.envs.tools.make_tools`."""
    if not callable(getattr(task, "verify", None)):
      raise ConfigError(f"ToolEnv needs a task env with verify(problem, text), got {task!r}")
    _check_positive("max_turns", max_turns, integer=True)
    _check_positive("max_obs_chars", max_obs_chars, integer=True)
    _check_positive("verify_timeout_s", verify_timeout_s)
    if max_tool_failures is not None:
      _check_positive("max_tool_failures", max_tool_failures, integer=True)
    if max_obs_chars < len(tool_calls.TRUNCATED):
      raise ConfigError(
        f"ToolEnv max_obs_chars={max_obs_chars} is below the cut mark's "
        f"{len(tool_calls.TRUNCATED)} characters; raise it"
      )
    is_built = isinstance(tools, dict) and all(
      isinstance(t, tools_lib.Tool) for t in tools.values()
    )
    if is_built and not tools:
      raise ConfigError("ToolEnv needs at least one tool, e.g. ['calculator']")
    self.task = task
    self.tools = tools if is_built else tools_lib.make_tools(tools)
    self.max_turns = max_turns
    self.max_obs_chars = max_obs_chars
    self.max_tool_failures = max_tool_failures
    self.verify_timeout_s = verify_timeout_s
    self.problem = None
    self.done = True

  def reset(self, problem: base.Problem) -> str:
    """Starts an episode on ``problem``; returns its prompt."""
    self.problem = problem
    self.done = False
    self.turns = self.tool_calls = self.tool_failures = 0
    return problem.prompt

  def _info(self, status: str, call: str | None, call_status: str | None) -> dict:
    return {
      "status": status,
      "turns": self.turns,
      "tool_calls": self.tool_calls,
      "tool_failures": self.tool_failures,
      "call": call,
      "call_status": call_status,
    }

  def _end(self, status: str, reward: float, observation: str, call=None, call_status=None):
    self.done = True
    return StepResult(observation, reward, True, self._info(status, call, call_status))

  def _answer(self, action_text: str) -> StepResult:
    """Scores the final answer with the verifier, under its timeout."""
    status, value = tools_lib.call_with_timeout(
      self.task.verify, self.verify_timeout_s, self.problem, tool_calls.final_text(action_text)
    )
    if status == "timeout":
      return self._end("env_timeout", 0.0, "")
    if status == "ok":
      try:
        return self._end("ok", float(value), "")
      except (TypeError, ValueError) as e:
        value = e
    result = self._end("env_error", 0.0, "")
    result.info["error"] = f"{type(value).__name__}: {value}"
    return result

  def step(self, action_text: str) -> StepResult:
    """Takes one model turn (see the class docstring)."""
    if self.problem is None or self.done:
      raise RuntimeError(
        "ToolEnv.step needs an episode in progress: call reset(problem) first "
        "(and again after done)"
      )
    if not isinstance(action_text, str):
      raise TypeError(f"ToolEnv.step takes the turn's text, got {type(action_text).__name__}")
    self.turns += 1
    call = tool_calls.parse(action_text, self.tools)
    if call is None:
      return self._answer(action_text)
    self.tool_calls += 1
    if isinstance(call, tool_calls.ParseError):
      name, call_status, text, ok = None, "parse_error", tools_lib.ERROR_PREFIX + call.reason, False
    else:
      output = self.tools[call.name](call.args)
      name, call_status, text, ok = call.name, output.status, output.text, output.ok
    self.tool_failures += not ok
    observation = tool_calls.render_observation(text, self.max_obs_chars)
    if self.max_tool_failures is not None and self.tool_failures >= self.max_tool_failures:
      return self._end("tool_error", 0.0, observation, name, call_status)
    if self.turns >= self.max_turns:
      return self._end("max_turns", 0.0, observation, name, call_status)
    return StepResult(observation, 0.0, False, self._info("running", name, call_status))


def step_all(
  envs: Sequence[AgentEnv], actions: Sequence[str | None], max_workers: int = 8
) -> list[StepResult | None]:
  """``envs[i].step(actions[i])`` for every row, concurrently in threads (a slow tool stalls
  only its row); a ``None`` action skips its row (an episode already done) and gives ``None``."""
  if len(envs) != len(actions):
    raise ValueError(
      f"step_all got {len(envs)} envs and {len(actions)} actions; give one action (or None) per env"
    )
  rows = [i for i, a in enumerate(actions) if a is not None]
  out: list[StepResult | None] = [None] * len(envs)
  if not rows:
    return out
  with concurrent.futures.ThreadPoolExecutor(min(max_workers, len(rows))) as pool:
    futures = {i: pool.submit(envs[i].step, actions[i]) for i in rows}
    for i, future in futures.items():
      out[i] = future.result()
  return out
