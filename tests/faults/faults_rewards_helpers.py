"""Rewards that misbehave, and the smoke config the reward fault tests run (in-process)."""

import json
import math
import os
import signal
import time

import faults_common  # tests/faults/faults_common.py

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _hang_sleep(problem, completion):
  time.sleep(1e6)


def _hang_busy(problem, completion):
  while True:
    pass


def _hang_ignoring_alarm(problem, completion):
  signal.signal(signal.SIGALRM, signal.SIG_IGN)  # only the parent's deadline can stop it
  time.sleep(1e6)


def _exit(problem, completion):
  os._exit(3)  # the worker process dies mid-call


def _raise(problem, completion):
  raise ZeroDivisionError(f"cannot score {completion!r}")


def exact(problem, completion):
  """A reward function (not an env): 1.0 for the stored answer."""
  return float(completion == problem.answer)


MODES = {
  "raise": _raise,
  "sleep": _hang_sleep,
  "busy": _hang_busy,
  "ignore_alarm": _hang_ignoring_alarm,
  "exit": _exit,
  "nan": lambda problem, completion: math.nan,
  "inf": lambda problem, completion: -math.inf,
  "string": lambda problem, completion: "1.0",
  "none": lambda problem, completion: None,
  "array": lambda problem, completion: [1.0, 0.0],
  "ok": lambda problem, completion: float(completion == problem.answer),
}


class BrokenReward:
  """The wrapped env (its problems, levels, chars) with a verify that misbehaves as ``mode``
  says; ``mode`` "by_text" takes the mode from the completion (unit tests)."""

  def __init__(self, env, mode: str):
    self.env, self.mode = env, mode

  def __getattr__(self, name):
    if name in ("env", "mode"):  # unpickling looks attributes up before they are set
      raise AttributeError(name)
    return getattr(self.env, name)

  def verify(self, problem, completion):
    mode = completion if self.mode == "by_text" else self.mode
    return MODES[mode](problem, completion)


def smoke_config(*, steps: int = 2, eval_every: int = 0, **reward):
  """The quickstart smoke config, RL only (from the random nano model), ``reward`` settings."""
  c = faults_common.smoke_config(
    stages=("rl",), rl=dict(steps=steps, eval_every=eval_every, checkpoint_every=2)
  )
  c.reward = dict(reward)
  return c


def records(workdir) -> list[dict]:
  with open(os.path.join(workdir, "rl", "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f]
