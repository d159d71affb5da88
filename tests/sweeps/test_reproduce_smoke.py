"""The smoke variant of every reproduction config runs through scripts/reproduce.py."""

import fcntl
import glob
import hashlib
import json
import os
import runpy
import shutil
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# Reproduction configs: a get_config with a sweep (experiments/libra.py, a simulation run by
# scripts/libra.py, has neither stages nor get_config: tests/sweeps/test_libra.py covers it).
CONFIGS = sorted(
  p
  for p in glob.glob(os.path.join(REPO, "experiments", "*.py"))
  if "sweep" in open(p).read() and "def get_config" in open(p).read()
)


def test_there_are_reproduction_configs():
  assert CONFIGS


def _base_signature(config: str) -> str | None:
  """What a config's shared pretraining stage depends on (seed 0, smoke), or None when it
  shares other stages: configs with equal signatures can start from one base checkpoint."""
  from posttrain_jax import defaults
  from posttrain_jax.sweeps import runner
  from posttrain_jax.train import workdir as workdir_lib

  module = runner.load_config_module(config)
  sweep = module.get_config(None).sweep
  if tuple(sweep.shared_stages) != ("pretrain",):
    return None
  c = module.get_config(f"arm={sweep.baseline},seed=0,smoke")
  t = c.rl.teacher  # a teacher's context widens the tokenizer and may be in the corpus
  context = (
    t.context,
    t.pretrain_context,
    t.pretrain_context_kwargs.to_dict(),
    t.context_kwargs.to_dict() if t.pretrain_context else {},
  )
  # every setting the workdir check compares for the pretraining stage (eval.precision, for
  # one, is in it: pretraining evaluates), so a copied base is never refused
  settings = workdir_lib.stage_settings(c, "pretrain", root=defaults.ROOT)
  return json.dumps(
    {"seed": c.seed, "settings": settings, "context": context}, sort_keys=True, default=str
  )


@pytest.fixture(scope="session")
def shared_base(tmp_path_factory):
  """``base(config) -> dir or None``: the seed-0 base (its finished pretraining stage) of the
  configs that share that stage's settings, built once per test run (a file lock shares it
  between xdist workers); None for a config whose base no other config shares."""
  signatures = {c: _base_signature(c) for c in CONFIGS}
  root = tmp_path_factory.getbasetemp().parent / "shared_bases"
  root.mkdir(exist_ok=True)

  def base(config: str):
    sig = signatures[config]
    if sig is None or list(signatures.values()).count(sig) < 2:
      return None
    path = root / hashlib.sha256(sig.encode()).hexdigest()[:16]
    with open(str(path) + ".lock", "w") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      if not (path / "pretrain" / "done.json").exists():
        module_arg = f"{os.path.relpath(config, REPO)}:seed=0,smoke"
        proc = subprocess.run(
          [
            sys.executable,
            "-m",
            "posttrain_jax.main",
            f"--config={module_arg}",
            f"--workdir={path}",
            "--config.stages=('pretrain',)",
            "--config.progress=False",
          ],
          cwd=REPO,
          capture_output=True,
          text=True,
          timeout=600,
          env=dict(
            os.environ, JAX_COMPILATION_CACHE_DIR=os.environ["POSTTRAIN_JAX_COMPILATION_CACHE"]
          ),
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    return path

  return base


# Each config runs one seed (the statistics over seeds are tested on records in
# test_stats.py), all of its arms one after another in the test's subprocess (--workers 0: one
# start-up, no program compiled twice); one config runs its arms in parallel subprocesses, as
# reproduce.py does by default.
PARALLEL = ("cero.py",)  # two arms, two workers


def _script(monkeypatch, capsys, name: str, *args: str) -> tuple[int, str, str]:
  """Runs ``scripts/NAME`` in this process (it is plumbing over library calls that this
  process has already imported and compiled): (exit code, stdout, stderr)."""
  monkeypatch.chdir(REPO)
  monkeypatch.setattr(sys, "argv", [name, *args])
  monkeypatch.setattr(sys, "path", list(sys.path))  # the script prepends the repository
  capsys.readouterr()
  with pytest.raises(SystemExit) as exit_:
    runpy.run_path(os.path.join(REPO, "scripts", name), run_name="__main__")
  out, err = capsys.readouterr()
  return exit_.value.code, out, err


@pytest.mark.parametrize("config", CONFIGS, ids=os.path.basename)
def test_reproduce_smoke(config, tmp_path, shared_base, monkeypatch, capsys):
  out = tmp_path / "out"
  base = shared_base(config)
  if base is not None:  # the seed-0 base other configs share: reproduce.py finds it done
    shutil.copytree(base, out / "runs" / "seed0" / "base", symlinks=True)
  workers = "2" if os.path.basename(config) in PARALLEL else "0"
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=os.environ["POSTTRAIN_JAX_COMPILATION_CACHE"])
  args = [
    os.path.relpath(config, REPO),
    "--seeds",
    "1",
    "--smoke",
    "--out",
    str(out),
    "--workers",
    workers,
  ]
  cmd = [sys.executable, os.path.join(REPO, "scripts", "reproduce.py"), *args]
  proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  table = (out / "table.md").read_text()
  # one seed cannot test a claim: the rule says so
  assert "Verdict: not measured." in table and "not measured (1 seeds with both sides)" in table
  runs = (out / "runs.jsonl").read_text()
  records = [json.loads(l) for l in runs.splitlines()]
  arms = {r["arm"] for r in records}
  assert len(records) == len(arms) and len(arms) >= 2
  from posttrain_jax.sweeps import runner

  if tuple(runner.load_config_module(config).get_config(None).sweep.curves):  # a study has none
    assert (out / "curves.png").stat().st_size > 1000
  # Every arm started from the same shared checkpoint (when the sweep shares one).
  if tuple(runner.load_config_module(config).get_config(None).sweep.shared_stages):
    assert len({r["accuracy_before_rl"] for r in records}) == 1
  # A second invocation resumes: nothing reruns, and the report is the same.
  code, stdout, _ = _script(monkeypatch, capsys, "reproduce.py", *args)
  jobs = [l for l in stdout.splitlines() if l.startswith("  seed0_")]
  studies = runner.load_config_module(config).get_config(None).sweep.program == "study"
  bases = 0 if studies else 1  # a sweep of studies has no base job: its studies make the bases
  assert code == 0 and len(jobs) == len(arms) + bases and all("(cached)" in l for l in jobs), stdout
  assert (out / "table.md").read_text() == table and (out / "runs.jsonl").read_text() == runs
  if os.path.basename(config) == "maxpo.py":  # arms differ in the advantage estimator
    _check_grad_variance(config, out, monkeypatch, capsys)
  if os.path.basename(config) in PARALLEL:  # runs made in parallel subprocesses
    _check_rerun(config, out, env)


def _untimed(path) -> list[dict]:
  text = path.read_text()
  items = [json.loads(text)] if path.suffix == ".json" else list(map(json.loads, text.splitlines()))
  return [{k: v for k, v in d.items() if not k.startswith(("time/", "wall"))} for d in items]


def _check_rerun(config, out, env):
  """``--check`` reruns seed 0 one job after another in one process: the same numbers as the
  parallel subprocesses gave (no dependence on the worker layout), and the table says so."""
  cmd = [
    sys.executable,
    os.path.join(REPO, "scripts", "reproduce.py"),
    os.path.relpath(config, REPO),
  ]
  cmd += ["--smoke", "--out", str(out), "--workers", "0", "--check"]
  proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  result = json.loads((out / "rerun.json").read_text())
  assert result["identical"] and result["seeds"] == [0] and not result["verdict"]["changed"]
  assert result["environment"]["layout"]["workers"] == 0
  # every number each run wrote (timings aside), not only the table's columns
  for arm in ("base", *result["arms_rerun"]):
    for name in ("summary.json", "rl/metrics.jsonl", "pretrain/metrics.jsonl"):
      a, b = out / "runs" / "seed0" / arm / name, out / "check" / "runs" / "seed0" / arm / name
      if not a.exists():
        continue
      assert _untimed(a) == _untimed(b), (arm, name)
  table = (out / "table.md").read_text()
  assert "Rerun check (seed 0 on " in table and "identical to the recorded runs" in table
  recorded = [json.loads(l) for l in (out / "environment.jsonl").read_text().splitlines()]
  assert recorded[-1]["recorded"] and recorded[-1]["layout"]["workers"] == 2
  # the same check again reuses the rerun: it re-summarises and keeps the environment the
  # runs were made in (workers 0), not this call's
  cmd[cmd.index("--workers") + 1] = "2"
  proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  again = json.loads((out / "rerun.json").read_text())
  assert again["environment"] == result["environment"] and again["rows"] == result["rows"]


def _check_grad_variance(config, out, monkeypatch, capsys):
  report = out / "gv.md"
  args = [
    os.path.relpath(config, REPO),
    "--seeds",
    "1",
    "--smoke",
    "--batches",
    "3",
    "--runs",
    str(out / "runs"),
    "--out",
    str(report),
  ]
  code, _, err = _script(monkeypatch, capsys, "grad_variance.py", *args)
  assert code == 0, err[-3000:]
  result = json.loads((out / "gv.jsonl").read_text().splitlines()[0])
  assert set(result["arms"]) == {"grpo", "pkpo", "maxpo"}
  # The statistics are checked against numpy and the gradient against the policy-gradient form
  # in test_grad_variance.py; here the script's wiring: every arm measured on the same
  # rollouts, its summary consistent with its moments.
  for arm in result["arms"].values():
    assert np.isfinite(arm["grad_norm_mean"])
    if arm["signal"] > 0:
      assert arm["relative_variance"] == pytest.approx(arm["total_variance"] / arm["signal"])
  assert "relative variance" in report.read_text()
  args[args.index("--runs") + 1] = str(out / "nowhere")
  code, _, err = _script(monkeypatch, capsys, "grad_variance.py", *args)
  assert code == 2 and err.startswith("error: no finished 'pretrain' stage in "), err


def test_in_process_runs_report_a_bad_config_with_exit_code_2(tmp_path):
  from posttrain_jax.sweeps import runner

  job = runner.Job(
    "bad",
    os.path.join(REPO, "experiments", "hpo.py"),
    "arm=grpo,seed=0,smoke",
    str(tmp_path / "run"),
    ("--config.rl.policy_loss='magic'",),
  )
  assert runner.job_config(job).rl.policy_loss == "magic"
  ((_, code, _),) = runner.run_all(
    [job], workers=0, log_dir=str(tmp_path / "logs"), echo=lambda *_: None
  )
  log = (tmp_path / "logs" / "bad.log").read_text()
  assert code == 2 and "policy_loss='magic' is unknown" in log
  assert not (tmp_path / "run" / "wall.json").exists()
  bad = runner.Job("typo", job.config_file, job.config_arg, job.workdir, ("--rl.lr=1",))
  with pytest.raises(ValueError, match="cannot apply"):
    runner.job_config(bad)
