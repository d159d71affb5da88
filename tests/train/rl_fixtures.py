"""Shared rl_run of the RL-loop tests: the smoke config, a coin-flip reward, run-and-resume."""

import importlib.util
import json
import math
import os
import shutil
import zlib

import pytest

from posttrain_jax import methods as methods_lib
from posttrain_jax.bench import speed as bench
from posttrain_jax.train import rl_step as step_lib
from posttrain_jax.train import workdir as workdir_lib

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


class CoinEnv:
  """Wraps an env so a random model earns reward half of the time (a checksum of the
  completion's text), so groups have signal: advantages, replay, mastered prompts, moves."""

  def __init__(self, env):
    self._env = env

  def __getattr__(self, name):
    if name == "_env":  # unpickling (in a reward worker) looks attributes up before _env is set
      raise AttributeError(name)
    return getattr(self._env, name)

  def verify(self, problem, completion):
    return float(zlib.crc32(f"{problem.uid}|{completion}".encode()) & 1)


def smoke_config(steps: int, scheduler: str = "none", **scheduler_kwargs):
  """The quickstart smoke config, RL only, no evaluation, a checkpoint every 2 steps."""
  spec = importlib.util.spec_from_file_location(
    "qs", os.path.join(REPO, "experiments", "quickstart.py")
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config("smoke")
  c.stages = ("rl",)
  c.progress = False
  c.rl.update(steps=steps, eval_every=0, checkpoint_every=2)
  c.rl.scheduler.name = scheduler
  c.rl.scheduler.kwargs.update(scheduler_kwargs)
  return c


def read_jsonl(path) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f]


def records(workdir) -> list[dict]:
  return read_jsonl(os.path.join(workdir, "rl", "metrics.jsonl"))


def run(workdir, config) -> list[dict]:
  """Runs ``config`` in ``workdir``; its RL records (one per step, no NaN)."""
  methods_lib.run(config, str(workdir))
  out = [r for r in records(workdir) if r["step"] > 0]
  assert [r["step"] for r in out] == list(range(1, len(out) + 1))
  for r in out:
    for k, v in r.items():
      assert not (isinstance(v, float) and math.isnan(v)), (k, r)
  return out


def run_counting_compiles(monkeypatch, workdir, config) -> tuple[list, list]:
  """``run`` plus the number of programs each RL iteration compiled."""
  counter, compiles, iteration = bench.CompileCounter(), [], step_lib.rl_step

  def counted(*args, **kwargs):
    before = counter.count
    out = iteration(*args, **kwargs)
    compiles.append(counter.count - before)
    return out

  with monkeypatch.context() as m:
    m.setattr(step_lib, "rl_step", counted)
    return run(workdir, config), compiles


def resumed_run(workdir, make_config, cut: int, steps: int) -> list[dict]:
  """Runs ``cut`` steps, removes the final parameters as if killed right after that
  checkpoint, then resumes to ``steps``; the resumed run's records."""
  run(workdir, make_config(cut))
  # The workdir of a run of `steps` steps killed right after step `cut`: its config.json says so.
  workdir_lib.write_config(str(workdir), make_config(steps))
  os.remove(os.path.join(workdir, "rl", "done.json"))
  shutil.rmtree(os.path.join(workdir, "rl", "final"))
  return run(workdir, make_config(steps))


def assert_same_records(full, resumed, label=""):
  assert len(full) == len(resumed)
  for a, b in zip(full, resumed):
    assert set(a) == set(b), set(a) ^ set(b)
    for k in a:
      if k.startswith("time/"):
        continue
      if isinstance(a[k], (int, float)):
        assert a[k] == pytest.approx(b[k], abs=1e-6, rel=1e-6), (label, a["step"], k, a[k], b[k])
      else:
        assert a[k] == b[k], (label, a["step"], k)
