"""Where a sweep's jobs run (sweeps/runner.py): a killed job is retried and resumes, a failing
one is not; the Ray backend, on a local Ray cluster this test starts and stops, gives the same
table as the local backend."""

import json
import os
import sys
import textwrap

import pytest

from posttrain_jax.sweeps import runner

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# A job program that kills itself (SIGKILL) on its first attempt and exits with EXIT after.
PROGRAM = textwrap.dedent(
  """
  import os, signal, sys
  workdir = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--workdir=")][0]
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, "attempts")
  n = len(open(path).read()) if os.path.exists(path) else 0
  open(path, "a").write("x")
  if n == 0:
    os.kill(os.getpid(), signal.SIGKILL)
  code = int(os.environ.get("EXIT", "0"))
  if code == 0:
    open(os.path.join(workdir, "summary.json"), "w").write("{}")
  sys.exit(code)
  """
)


@pytest.fixture
def program(tmp_path, monkeypatch):
  (tmp_path / "self_kill_job.py").write_text(PROGRAM)
  monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
  return lambda name: runner.Job(name, "none.py", "", str(tmp_path / name), module="self_kill_job")


def _attempts(job) -> int:
  with open(os.path.join(job.workdir, "attempts")) as f:
    return len(f.read())


def test_a_killed_job_is_retried_and_a_failing_one_is_not(program, tmp_path, monkeypatch):
  job = program("killed_once")
  _, code, _ = runner.run_job_retrying(job, str(tmp_path / "logs"), retries=2)
  assert code == 0 and _attempts(job) == 2
  assert runner.wall_seconds(job.workdir, "cpu_s") > 0  # the child's CPU time is recorded
  _, code, _ = runner.run_job_retrying(job, str(tmp_path / "logs"), retries=2)
  assert code == 0 and _attempts(job) == 2  # finished: not run again
  job = program("no_retries")
  _, code, _ = runner.run_job_retrying(job, str(tmp_path / "logs"), retries=0)
  assert runner.killed(code) and _attempts(job) == 1
  monkeypatch.setenv("EXIT", "3")
  job = program("fails")
  _, code, _ = runner.run_job_retrying(job, str(tmp_path / "logs"), retries=2)
  assert code == 3 and _attempts(job) == 2  # killed once, then failed on its own: no retry
  assert not runner.killed(3) and runner.killed(-9) and runner.killed(137)


def test_unknown_backend_is_named():
  with pytest.raises(ValueError, match="unknown backend 'slurm'; valid backends: local, ray"):
    runner.make_backend("slurm")


def _records(out):
  with open(os.path.join(out, "runs.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return sorted(
    (
      json.dumps({k: v for k, v in r.items() if k not in ("wall_s", "workdir")}, sort_keys=True)
      for r in rows
    )
  )


@pytest.mark.slow
def test_the_ray_backend_gives_the_local_backends_table(tmp_path):
  ray = pytest.importorskip("ray")
  sys.path.insert(0, REPO)
  from posttrain_jax.sweeps.reproduce import reproduce

  config = os.path.join(REPO, "experiments", "hpo.py")
  local = reproduce(
    config, 1, smoke=True, out_dir=str(tmp_path / "local"), workers=0, echo=lambda _: None
  )
  ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
  try:
    lines = []
    remote = reproduce(
      config, 1, smoke=True, out_dir=str(tmp_path / "ray"), backend="ray", echo=lines.append
    )
  finally:
    ray.shutdown()
  assert any("as Ray tasks" in line for line in lines)
  assert _records(tmp_path / "local") == _records(tmp_path / "ray")
  assert local.split("Command:")[0].replace(str(tmp_path / "local"), "") == remote.split(
    "Command:"
  )[0].replace(str(tmp_path / "ray"), "")


def test_a_finished_job_reads_as_cached_even_without_a_recorded_time(tmp_path):
  job = runner.Job("done", "none.py", "", str(tmp_path / "done"))
  os.makedirs(job.workdir)
  (tmp_path / "done" / job.done_file).write_text("{}")
  _, code, secs = runner.run_job(job, str(tmp_path / "logs"))  # no wall.json: 0 s recorded
  assert code == 0 and secs < 0 and not (tmp_path / "logs").exists()
