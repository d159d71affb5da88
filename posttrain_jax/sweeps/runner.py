"""Runs a reproduction config's arms x seeds as subprocesses of ``posttrain_jax.main``, or
one after another in this process (``workers=0``: no interpreter start, import or compile of
a program another run already compiled; the fastest way through a small sweep on a laptop), or
as Ray tasks on a cluster (:class:`RayBackend`, ``pip install -e .[ray]``; docs/scale.md).

Layout under ``out_dir/runs/``: ``seed{S}/base`` runs the shared stages (pretraining) once per
seed; ``seed{S}/{arm}`` runs the rest, with the base's stage folders linked in, so every arm
starts from the same checkpoint. A run whose ``summary.json`` exists is not run again; an
interrupted run resumes from its checkpoints (the stage mechanism of ``main``).

A job is a program (``Job.module``: ``posttrain_jax.main``, or ``posttrain_jax.sweeps.hpo`` for
a hyperparameter study) run on one config in one workdir; each finished job records its wall
and CPU seconds in ``WORKDIR/wall.json``.
"""

import concurrent.futures
import dataclasses
import importlib.util
import json
import os
import signal
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


MAIN = "posttrain_jax.main"  # the program of an experiment run
STUDY = "posttrain_jax.sweeps.hpo"  # the program of a hyperparameter study (its run_config)


@dataclasses.dataclass(frozen=True)
class Job:
  """One subprocess run: ``config_arg`` is the text after ':' in ``--config=FILE:ARG``."""

  name: str
  config_file: str
  config_arg: str
  workdir: str
  overrides: tuple = ()
  done_file: str = "summary.json"
  module: str = MAIN

  def command(self) -> list[str]:
    return [
      sys.executable,
      "-m",
      self.module,
      f"--config={self.config_file}:{self.config_arg}",
      f"--workdir={self.workdir}",
      "--config.progress=False",
      *self.overrides,
    ]


def wall_seconds(workdir: str, key: str = "wall_s") -> float:
  """Wall time (``key="cpu_s"``: CPU time) of the run that finished in ``workdir`` (0 when not
  recorded)."""
  try:
    with open(os.path.join(workdir, "wall.json"), encoding="utf-8") as f:
      return float(json.load(f)[key])
  except (OSError, ValueError, KeyError):
    return 0.0


def _record_time(workdir: str, wall: float, cpu: float) -> None:
  with open(os.path.join(workdir, "wall.json"), "w", encoding="utf-8") as f:
    json.dump({"wall_s": wall, "cpu_s": cpu}, f)


def _call(command: list[str], log, cwd: str | None = None) -> tuple[int, float]:
  """Runs ``command`` with its output in ``log``; (exit code, the child's CPU seconds: user +
  system of it and the children it waited for, measured for this child alone, so jobs run side
  by side in threads do not mix)."""
  proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
  try:
    _, status, usage = os.wait4(proc.pid, 0)
  except BaseException:
    proc.kill()
    proc.wait()
    raise
  proc.returncode = os.waitstatus_to_exitcode(status)
  return proc.returncode, usage.ru_utime + usage.ru_stime


def run_job(job: Job, log_dir: str) -> tuple[Job, int, float]:
  """Runs ``job`` with its output in ``log_dir/<name>.log``; returns (job, exit code, seconds).

  A finished job is not rerun; its recorded wall time is returned, negative (cached): a job
  that recorded none (0) returns -1e-9, so ``secs < 0`` tells a cached job from a run one.
  """
  if os.path.exists(os.path.join(job.workdir, job.done_file)):
    return job, 0, -max(wall_seconds(job.workdir), 1e-9)
  os.makedirs(log_dir, exist_ok=True)
  start = time.time()
  with open(os.path.join(log_dir, f"{job.name}.log"), "a", encoding="utf-8") as log:
    log.write("$ " + " ".join(job.command()) + "\n")
    log.flush()
    code, cpu = _call(job.command(), log)
  secs = time.time() - start
  if code == 0:
    _record_time(job.workdir, secs, cpu)
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
  import importlib  # pylint: disable=import-outside-toplevel

  from posttrain_jax.io import CheckpointError  # pylint: disable=import-outside-toplevel
  from posttrain_jax.methods import run  # pylint: disable=import-outside-toplevel
  from posttrain_jax.train import ConfigError, TrainingError  # pylint: disable=import-outside-toplevel

  errors = (ConfigError, CheckpointError, TrainingError)
  if job.module != MAIN:  # a study: a bad setting or a failed run of it is reported too
    errors += (ValueError, RuntimeError)
  os.makedirs(log_dir, exist_ok=True)
  start, cpu0 = time.time(), time.process_time()
  with open(os.path.join(log_dir, f"{job.name}.log"), "a", encoding="utf-8") as log:
    log.write("$ (in process) " + " ".join(job.command()[1:]) + "\n")
    log.flush()
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
      try:
        if job.module == MAIN:
          config = job_config(job)
          # As posttrain_jax.main does: this job's store of compiled programs (or none).
          from posttrain_jax import parallel  # pylint: disable=import-outside-toplevel
          from posttrain_jax.train import context  # pylint: disable=import-outside-toplevel

          parallel.executables.install(context.executable_store(config, job.workdir))
          run(config, job.workdir)
        else:  # another program (a study): its run_in_process(job)
          importlib.import_module(job.module).run_in_process(job)
        code = 0
      except errors as e:
        print(f"error: {e}", file=sys.stderr)
        code = 2
      except Exception:  # pylint: disable=broad-except
        traceback.print_exc()
        code = 1
  secs = time.time() - start
  if code == 0:
    _record_time(job.workdir, secs, time.process_time() - cpu0)
  return job, code, secs


class LocalBackend:
  """Jobs on this machine: up to ``workers`` subprocesses side by side, or (``workers=0``) one
  after another in this process."""

  def __init__(self, workers: int):
    self.workers = workers

  def describe(self) -> str:
    return f"{self.workers} at a time" if self.workers else "one after another in this process"

  def map(self, jobs: list[Job], log_dir: str):
    """Yields (job, exit code, seconds) in the order of ``jobs``."""
    if self.workers == 0:
      yield from (run_job_in_process(j, log_dir) for j in jobs)
      return
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(self.workers, 1)) as pool:
      yield from pool.map(lambda j: run_job(j, log_dir), jobs)


def killed(code: int) -> bool:
  """Whether an exit code says the job was killed (by a signal, or the OOM killer's SIGKILL seen
  through a shell) rather than failing on its own."""
  return code < 0 or code in (128 + signal.SIGKILL, 128 + signal.SIGTERM)


def run_job_retrying(job: Job, log_dir: str, retries: int) -> tuple[Job, int, float]:
  """:func:`run_job`, run again (it resumes from its checkpoints) up to ``retries`` times while
  it is killed; a job that fails on its own is not retried (its log says why)."""
  for attempt in range(retries + 1):
    job_, code, secs = run_job(job, log_dir)
    if not killed(code) or attempt == retries:
      return job_, code, secs
    with open(os.path.join(log_dir, f"{job.name}.log"), "a", encoding="utf-8") as log:
      log.write(f"[runner] killed (exit {code}); retry {attempt + 1} of {retries}\n")
  raise AssertionError("unreachable")


class RayBackend:
  """Jobs as Ray tasks (``pip install -e .[ray]``): each task runs the job's subprocess on a
  node with ``cpus`` CPUs and ``gpus`` accelerators free, and is retried ``retries`` times when
  it is killed (the subprocess by a signal, or the Ray worker itself; a retry resumes from the
  job's checkpoints). Workdirs, logs and config files must be on storage every node sees (a
  shared file system): paths are made absolute here. ``address``: the cluster's (``ray start
  --head`` prints it; None: ``RAY_ADDRESS``, a Ray already initialised in this process, or a
  local cluster of this machine's cores started for the sweep and stopped after it)."""

  def __init__(
    self, address: str | None = None, cpus: float = 1, gpus: float = 0, retries: int = 2
  ):
    self.address, self.cpus, self.gpus, self.retries = address, cpus, gpus, retries

  def describe(self) -> str:
    return f"as Ray tasks ({self.cpus:g} CPU, {self.gpus:g} GPU each, {self.retries} retries)"

  def map(self, jobs: list[Job], log_dir: str):
    try:
      import ray  # pylint: disable=import-outside-toplevel
    except ImportError:
      raise ValueError(
        "the Ray backend needs Ray: pip install -e '.[ray]' (or run with the local backend)"
      ) from None
    started = not ray.is_initialized()
    if started:
      ray.init(
        address=self.address or os.environ.get("RAY_ADDRESS") or None,
        include_dashboard=False,
        log_to_driver=False,
      )
    try:
      task = ray.remote(num_cpus=self.cpus, num_gpus=self.gpus, max_retries=self.retries)(
        run_job_retrying
      )
      log_dir = os.path.abspath(log_dir)
      refs = [task.remote(absolute(j), log_dir, self.retries) for j in jobs]
      for job, ref in zip(jobs, refs):
        _, code, secs = ray.get(ref)
        yield job, code, secs
    finally:
      if started:
        ray.shutdown()


def absolute(job: Job) -> Job:
  """``job`` with absolute config and workdir paths (a Ray worker runs in another folder)."""
  return dataclasses.replace(
    job, config_file=os.path.abspath(job.config_file), workdir=os.path.abspath(job.workdir)
  )


def make_backend(name: str = "local", *, workers: int = 0, address: str | None = None, **kwargs):
  """The backend called ``name``: ``local`` (``workers`` subprocesses, 0: in this process) or
  ``ray`` (``address``, ``cpus``, ``gpus``, ``retries``)."""
  if name == "local":
    return LocalBackend(workers)
  if name == "ray":
    return RayBackend(address, **kwargs)
  raise ValueError(f"unknown backend {name!r}; valid backends: local, ray")


def run_all(
  jobs: list[Job], *, workers: int = 0, log_dir: str, echo=print, backend=None
) -> list[tuple]:
  """Runs ``jobs`` through ``backend`` (default :class:`LocalBackend` of ``workers``: up to that
  many subprocesses in parallel, or one after another in this process); returns [(job, code,
  seconds)] in the order of ``jobs``."""
  backend = LocalBackend(workers) if backend is None else backend
  results = []
  for job, code, secs in backend.map(jobs, log_dir):
    status = "ok" if code == 0 else f"FAILED (exit {code}, see {log_dir}/{job.name}.log)"
    echo(f"  {job.name}: {status}" + (f" in {secs:.0f}s" if secs > 0 else " (cached)"))
    results.append((job, code, secs))
  return results
