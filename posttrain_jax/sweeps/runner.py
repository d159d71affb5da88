"""Runs a reproduction config's arms x seeds as subprocesses of ``posttrain_jax.main``, or
one after another in this process (``workers=0``: no interpreter start, import or compile of
a program another run already compiled; the fastest way through a small sweep on a laptop).

Layout under ``out_dir/runs/``: ``seed{S}/base`` runs the shared stages (pretraining) once per
seed; ``seed{S}/{arm}`` runs the rest, with the base's stage folders linked in, so every arm
starts from the same checkpoint. A run whose ``summary.json`` exists is not run again; an
interrupted run resumes from its checkpoints (the stage mechanism of ``main``).
"""

import concurrent.futures
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import time


def load_config_module(path: str):
  """The experiment config file at ``path``, imported (its ``get_config``)."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"no config file {path!r}")
  spec = importlib.util.spec_from_file_location("reproduction_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@dataclasses.dataclass(frozen=True)
class Job:
  """One subprocess run: ``config_arg`` is the text after ':' in ``--config=FILE:ARG``."""

  name: str
  config_file: str
  config_arg: str
  workdir: str
  overrides: tuple = ()
  done_file: str = "summary.json"

  def command(self) -> list[str]:
    return [
      sys.executable,
      "-m",
      "posttrain_jax.main",
      f"--config={self.config_file}:{self.config_arg}",
      f"--workdir={self.workdir}",
      "--config.progress=False",
      *self.overrides,
    ]


def wall_seconds(workdir: str) -> float:
  """Wall time of the run that finished in ``workdir`` (0 when not recorded)."""
  try:
    with open(os.path.join(workdir, "wall.json"), encoding="utf-8") as f:
      return float(json.load(f)["wall_s"])
  except (OSError, ValueError, KeyError):
    return 0.0


def run_job(job: Job, log_dir: str) -> tuple[Job, int, float]:
  """Runs ``job`` with its output in ``log_dir/<name>.log``; returns (job, exit code, seconds).

  A finished job is not rerun; its recorded wall time is returned (negative: cached).
  """
  if os.path.exists(os.path.join(job.workdir, job.done_file)):
    return job, 0, -wall_seconds(job.workdir)
  os.makedirs(log_dir, exist_ok=True)
  start = time.time()
  with open(os.path.join(log_dir, f"{job.name}.log"), "a", encoding="utf-8") as log:
    log.write("$ " + " ".join(job.command()) + "\n")
    log.flush()
    code = subprocess.call(job.command(), stdout=log, stderr=subprocess.STDOUT)
  secs = time.time() - start
  if code == 0:
    with open(os.path.join(job.workdir, "wall.json"), "w", encoding="utf-8") as f:
      json.dump({"wall_s": secs}, f)
  return job, code, secs


def link_shared_stages(base_workdir: str, arm_workdir: str, stages) -> None:
  """Makes ``arm_workdir/STAGE`` a symlink to the finished ``base_workdir/STAGE`` (and shares
  the tokenizer), so the arm's run skips those stages."""
  os.makedirs(arm_workdir, exist_ok=True)
  for name in (*stages, "tokenizer"):
    src, dst = os.path.join(base_workdir, name), os.path.join(arm_workdir, name)
    if os.path.isdir(src) and not os.path.lexists(dst):
      os.symlink(os.path.relpath(src, arm_workdir), dst)


def job_config(job: Job):
  """The config ``job`` runs: its file's ``get_config(config_arg)`` with the job's
  ``--config.KEY=VALUE`` overrides (Python literals, else strings) and progress bars off."""
  import ast  # pylint: disable=import-outside-toplevel

  config = load_config_module(job.config_file).get_config(job.config_arg)
  for override in ("--config.progress=False", *job.overrides):
    if not override.startswith("--config.") or "=" not in override:
      raise ValueError(f"job {job.name}: cannot apply {override!r} in process")
    path, text = override[len("--config.") :].split("=", 1)
    *parents, leaf = path.split(".")
    node = config
    for name in parents:
      node = node[name]
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text
    with node.ignore_type():
      node[leaf] = value
  return config


def run_job_in_process(job: Job, log_dir: str) -> tuple[Job, int, float]:
  """:func:`run_job` in this process: ``methods.run`` on :func:`job_config`, its output in the
  log; a config, checkpoint or training error gives exit code 2, any other exception 1."""
  import contextlib  # pylint: disable=import-outside-toplevel
  import traceback  # pylint: disable=import-outside-toplevel

  if os.path.exists(os.path.join(job.workdir, job.done_file)):
    return job, 0, -wall_seconds(job.workdir)
  from posttrain_jax.io import CheckpointError  # pylint: disable=import-outside-toplevel
  from posttrain_jax.methods import run  # pylint: disable=import-outside-toplevel
  from posttrain_jax.train import ConfigError, TrainingError  # pylint: disable=import-outside-toplevel

  os.makedirs(log_dir, exist_ok=True)
  start = time.time()
  with open(os.path.join(log_dir, f"{job.name}.log"), "a", encoding="utf-8") as log:
    log.write("$ (in process) " + " ".join(job.command()[1:]) + "\n")
    log.flush()
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
      try:
        config = job_config(job)
        # As posttrain_jax.main does: this job's store of compiled programs (or none).
        from posttrain_jax import parallel  # pylint: disable=import-outside-toplevel
        from posttrain_jax.train import context  # pylint: disable=import-outside-toplevel

        parallel.executables.install(context.executable_store(config, job.workdir))
        run(config, job.workdir)
        code = 0
      except (ConfigError, CheckpointError, TrainingError) as e:
        print(f"error: {e}", file=sys.stderr)
        code = 2
      except Exception:  # pylint: disable=broad-except
        traceback.print_exc()
        code = 1
  secs = time.time() - start
  if code == 0:
    with open(os.path.join(job.workdir, "wall.json"), "w", encoding="utf-8") as f:
      json.dump({"wall_s": secs}, f)
  return job, code, secs


def run_all(jobs: list[Job], *, workers: int, log_dir: str, echo=print) -> list[tuple]:
  """Runs ``jobs`` with up to ``workers`` subprocesses in parallel, or (``workers=0``) one
  after another in this process; returns [(job, code, seconds)]."""
  results = []
  if workers == 0:
    outcomes = (run_job_in_process(j, log_dir) for j in jobs)
  else:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(workers, 1))
    outcomes = pool.map(lambda j: run_job(j, log_dir), jobs)
  try:
    for job, code, secs in outcomes:
      status = "ok" if code == 0 else f"FAILED (exit {code}, see {log_dir}/{job.name}.log)"
      echo(f"  {job.name}: {status}" + (f" in {secs:.0f}s" if secs > 0 else " (cached)"))
      results.append((job, code, secs))
  finally:
    if workers != 0:
      pool.shutdown()
  return results
