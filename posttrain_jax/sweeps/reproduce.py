"""``reproduce(config_file, seeds)``: arms x seeds of a reproduction config -> results/NAME/.

A reproduction config is an experiment file whose ``get_config(arg)`` accepts ``arm=NAME``,
``seed=N`` and ``smoke`` and carries a ``sweep`` section:

    sweep.title          heading of the table
    sweep.arms           arm names, the first run is not special
    sweep.baseline       the arm every other arm is compared with (paired over seeds)
    sweep.shared_stages  stages run once per seed and shared by every arm (e.g. ('pretrain',))
    sweep.metrics        keys of summary.json reported in the table
    sweep.claim          text, arm, metric, direction ('higher' | 'lower'): the paper's claim,
                         declared before the runs
    sweep.curves         RL metric keys plotted per arm (optional)
    sweep.notes          extra lines printed under the table: settings and reasons, never
                         results (optional)
    sweep.base_health    the base-health gate (optional): ``metric`` (a summary key of the
                         evaluation of the shared stages, e.g. accuracy_before_rl) and ``floor``;
                         optionally ``arm`` (whose evaluation of the shared start is checked;
                         default the baseline); a seed whose shared start scores below it is
                         replaced by the next unused seed (at most ``seeds`` replacements), and
                         the table counts them (results/NAME/bases.jsonl). Smoke runs record
                         it and replace nothing.
"""

import datetime
import json
import math
import os
import subprocess
from typing import NamedTuple

from posttrain_jax import defaults
from posttrain_jax import io as ptio
from posttrain_jax.sweeps import environment, report, rerun_check, runner
from posttrain_jax.train import stages as stages_lib

load_config_module = runner.load_config_module
BASES = "bases.jsonl"  # the base-health gate's record: one line per seed checked


def _comparable(records) -> list[str]:
  return sorted(
    json.dumps({k: v for k, v in r.items() if k not in ("wall_s", "workdir")}, sort_keys=True)
    for r in records
  )


def _changed(out_dir: str, records: list[dict]) -> bool:
  """Whether a committed table exists in ``out_dir`` and its runs differ from ``records``."""
  old = os.path.join(out_dir, "runs.jsonl")
  if not (os.path.exists(old) and os.path.exists(os.path.join(out_dir, "table.md"))):
    return False
  return _comparable(ptio.read_jsonl(old)) != _comparable(records)


def retire_table(out_dir: str, records: list[dict], doc: str | None) -> bool:
  """When ``records`` differ from the committed table's runs, the table about to be replaced
  moves to history.md under the config's 'Changed for the rerun' paragraph, and its rerun
  check, which compared other runs, goes (rerun.json, rerun.md and the check's runs in
  check/): a table never states a check of runs it no longer shows. Returns whether it did."""
  if not _changed(out_dir, records):
    return False
  report.archive(
    out_dir,
    report.paragraph(doc, report.CHANGED),
    when=datetime.date.today().isoformat(),
    commit=current_commit(),
  )
  rerun_check.discard(out_dir)
  return True


def current_commit() -> str:
  """The repository's HEAD commit (short), 'unknown' outside a git checkout."""
  try:
    out = subprocess.run(
      ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
    )
  except OSError:
    return "unknown"
  return out.stdout.strip() or "unknown"


def _made(path: str) -> str:
  os.makedirs(path, exist_ok=True)
  return path


def _base_value(runs_dir: str, seed: int, metric: str) -> float:
  """The gate's metric from a seed's base evaluation (NaN when the base did not finish)."""
  path = os.path.join(runs_dir, f"seed{seed}", "base", "summary.json")
  if not os.path.exists(path):
    return float("nan")
  with open(path, encoding="utf-8") as f:
    summary = json.load(f)
  if metric not in summary:
    raise ValueError(
      f"sweep.base_health.metric {metric!r} is not in {path} (it has {sorted(summary)}); name "
      "a key the evaluation of the shared stages writes"
    )
  return float(summary[metric])


def gate_record(gate, seed: int, value: float, *, used_if_low: bool) -> dict:
  """One line of bases.jsonl: the seed's start value against the floor (NaN, a base that
  failed, is not healthy); ``used``: whether the seed's runs are in the table."""
  ok = value >= float(gate.floor)
  return {
    "seed": seed,
    "metric": gate.metric,
    "value": value,
    "floor": gate.floor,
    "healthy": ok,
    "used": ok or used_if_low,
  }


def _write_bases(out_dir: str, bases: list[dict]) -> None:
  with open(os.path.join(out_dir, BASES), "w", encoding="utf-8") as f:
    f.writelines(json.dumps(b, sort_keys=True) + "\n" for b in bases)


def healthy_seeds(run_bases, base_value, seeds: int, gate, smoke: bool = False):
  """The base-health gate: runs the bases of seeds 0..seeds-1 (``run_bases(seeds) -> failed
  jobs``), reads each one's ``base_value(seed)`` and replaces a seed below ``gate.floor`` by the
  next unused seed, at most ``seeds`` times. A base that failed (NaN) is left out and not
  replaced: the failure is reported (reproduce raises), not papered over by another seed. Returns (failed jobs,
  the healthy seeds in order, one record per seed checked). ``smoke``: records, replaces
  nothing."""
  failed, healthy, bases = [], [], []
  candidates, next_seed = list(range(seeds)), seeds
  while candidates:
    failed += run_bases(candidates)
    short = 0
    for seed in candidates:
      value = base_value(seed)
      bases.append(gate_record(gate, seed, value, used_if_low=smoke))
      if bases[-1]["used"]:
        healthy.append(seed)
      elif math.isfinite(value):  # a failed base is an error to fix, not a seed to replace
        short += 1
    short = min(short, 2 * seeds - next_seed)
    candidates = list(range(next_seed, next_seed + short))
    next_seed += short
  return failed, healthy, bases


def sweep_of(module, smoke: bool = False):
  """A reproduction config's sweep section: ``get_config``'s, or a simulation config's
  ``sweep()`` (scripts/libra.py), which declares the same fields."""
  if hasattr(module, "get_config"):
    return module.get_config(_arg(module.get_config(None).sweep.baseline, 0, smoke)).sweep
  return module.sweep()


def _arg(arm: str, seed: int, smoke: bool) -> str:
  return f"arm={arm},seed={seed}" + (",smoke" if smoke else "")


# Fields of a shared section that only the RL stage reads, so arms may differ in them:
# env.dataset picks RL's prompt source (pretraining draws its corpus from env.name / level).
RL_ONLY_FIELDS = {"env": ("dataset",)}


# The keys of a stage that is not a config section of its own: the `teacher` stage trains
# config.rl.teacher's model (train/teacher_model.py).
STAGE_KEYS = {"teacher": ("source", "preset", "overrides", "pretrain_steps", "pretrain_noise")}


def _shared_view(cfg, key: str) -> dict:
  spec = stages_lib.spec_of(cfg, key)
  if spec:  # a stage of its own (config.stage_specs): its spec and its kind's section
    stage = {s.name: s for s in stages_lib.plan(defaults.complete(cfg))}[key]
    section = stages_lib.STAGES[stage.kind].section
    return {"spec": spec, section: stage.config[section].to_dict() if section else None}
  teacher = cfg.rl.teacher.to_dict()
  if key in STAGE_KEYS:
    return {k: teacher[k] for k in STAGE_KEYS[key]}
  out = cfg[key].to_dict()
  if key == "pretrain" and teacher["pretrain_context"]:  # pretraining shows the context
    name = teacher.get("pretrain_context_name", "") or teacher["context"]
    out["teacher_context"] = (
      name,
      teacher["pretrain_context"],
      teacher["pretrain_context_kwargs"]
      or (teacher["context_kwargs"] if name == teacher["context"] else {}),
    )
  for field in RL_ONLY_FIELDS.get(key, ()):
    out.pop(field, None)
  return out


def check_shared(module, sweep, smoke: bool) -> None:
  """Every arm must agree on the shared stages, the model and the env, or sharing is wrong; a
  sweep that shares no stage (each arm trains from scratch, e.g. on its own env) only on the
  model."""
  ref = module.get_config(_arg(sweep.baseline, 0, smoke))
  shared = tuple(sweep.shared_stages)
  for arm in sweep.arms:
    cfg = module.get_config(_arg(arm, 0, smoke))
    for key in ("model", "env", *shared) if shared else ("model",):
      if _shared_view(cfg, key) != _shared_view(ref, key):
        raise ValueError(
          f"arm {arm!r} changes config.{key}, which the sweep shares between "
          "arms; move the change out of the shared stages"
        )


class SweepRun(NamedTuple):
  """What :func:`run_sweep` ran: the finished runs' records, the jobs that failed, the
  base-health gate's records, how many jobs ran now and how many were already done."""

  records: list
  failed: list
  bases: list
  jobs_run: int
  jobs_cached: int


def run_sweep(
  config_file: str,
  module,
  sweep,
  *,
  seeds: int,
  out_dir: str,
  pool,
  smoke: bool = False,
  seed_list=None,
  overrides: tuple = (),
  echo=print,
) -> SweepRun:
  """Runs the sweep's shared stages once per seed, then every arm of every seed, in
  ``out_dir``/runs (finished jobs are skipped). Seeds 0..``seeds``-1, a base below the
  base-health gate's floor replaced by the next unused seed; or exactly ``seed_list`` (a rerun
  check: the gate is recorded, nothing is replaced). ``overrides`` (``--config.KEY=VALUE``) go
  to every job, shared stages included (a pilot's setting, sweeps/pilot.py)."""
  name = os.path.splitext(os.path.basename(config_file))[0]
  runs_dir, log_dir = os.path.join(out_dir, "runs"), os.path.join(out_dir, "logs")
  shared = tuple(sweep.shared_stages)
  gate = sweep.get("base_health", None)
  if gate is not None and not shared:
    raise ValueError(f"{config_file}: sweep.base_health needs shared stages to check")
  counts = {"run": 0, "cached": 0}

  def tally(results):
    for _, code, secs in results:
      if secs < 0:
        counts["cached"] += 1
      elif code == 0:
        counts["run"] += 1

  def base_job(seed: int) -> runner.Job:
    base = os.path.join(runs_dir, f"seed{seed}", "base")
    stages = shared + (("eval",) if gate is not None else ())
    if gate is not None:
      done = "summary.json"
    else:  # a sweep that shares nothing writes the config only
      done = os.path.join(shared[-1], "done.json") if shared else "config.json"
    return runner.Job(
      f"seed{seed}_base",
      config_file,
      _arg(gate.get("arm", sweep.baseline) if gate is not None else sweep.baseline, seed, smoke),
      base,
      (f"--config.stages={stages!r}", *overrides),
      done_file=done,
    )

  # --- 1. shared stages, once per seed (and the base-health gate) -----------------------------
  planned = list(seed_list) if seed_list is not None else list(range(seeds))
  echo(f"[{name}] shared stages {shared} for seeds {planned}")

  def run_bases(candidates):
    results = runner.run_all(
      [base_job(s) for s in candidates], backend=pool, log_dir=log_dir, echo=echo
    )
    tally(results)
    return [j for j, code, _ in results if code]

  studies = sweep.get("program", "run") == "study"  # each job a study that makes its bases
  if studies:
    failed, seed_list, bases = [], planned, []
  elif gate is None:
    failed, seed_list, bases = run_bases(planned), planned, []
  elif seed_list is not None:  # a rerun: these seeds, the gate recorded, nothing replaced
    failed = run_bases(planned)
    bases = [
      gate_record(gate, s, _base_value(runs_dir, s, gate.metric), used_if_low=True) for s in planned
    ]
  else:
    failed, seed_list, bases = healthy_seeds(
      run_bases, lambda s: _base_value(runs_dir, s, gate.metric), seeds, gate, smoke
    )
    _write_bases(_made(out_dir), bases)
    echo(f"[{name}] {report.gate_line(gate, bases)}")
  # --- 2. arms x seeds -------------------------------------------------------------------------
  jobs = []
  for seed in seed_list:
    base = os.path.join(runs_dir, f"seed{seed}", "base")
    for arm in sweep.arms:
      workdir = os.path.join(runs_dir, f"seed{seed}", arm)
      runner.link_shared_stages(base, workdir, shared)
      program = runner.STUDY if studies else runner.MAIN
      jobs.append(
        runner.Job(
          f"seed{seed}_{arm}",
          config_file,
          _arg(arm, seed, smoke),
          workdir,
          tuple(overrides),
          module=program,
        )
      )
  echo(
    f"[{name}] {len(jobs)} runs ({len(sweep.arms)} arms x {len(seed_list)} seeds), "
    + pool.describe()
  )
  results = runner.run_all(jobs, backend=pool, log_dir=log_dir, echo=echo)
  tally(results)
  failed += [j for j, code, _ in results if code]
  records = []
  for job, code, secs in results:
    path = os.path.join(job.workdir, "summary.json")
    if os.path.exists(path):
      with open(path, encoding="utf-8") as f:
        summary = json.load(f)
      arm = job.name.split("_", 1)[1]
      records.append(
        {
          "arm": arm,
          "seed": summary["seed"],
          "workdir": job.workdir,
          "wall_s": abs(secs),
          **summary,
        }
      )
  return SweepRun(records, failed, bases, counts["run"], counts["cached"])


def make_pool(backend: str, workers: int | None, ray_address: str | None, cpu_threads: int):
  """The sweep's backend; ``workers`` None: one per core. One after another in this process
  (``workers=0``) sizes this process's XLA:CPU threads now, before a job starts JAX, as a
  subprocess's run does (parallel/host.py)."""
  workers = max(1, os.cpu_count() or 1) if workers is None else workers
  if workers < 0:
    raise ValueError(
      f"workers must be >= 0 (0: one run after another in this process), got {workers}"
    )
  if backend == "local" and workers == 0:
    from posttrain_jax.parallel import host  # pylint: disable=import-outside-toplevel

    host.set_cpu_threads(cpu_threads)
  return runner.make_backend(backend, workers=workers, address=ray_address), workers


def command_line(config_file: str, seeds: int, smoke: bool, *extra: str) -> str:
  return " ".join(
    ["python", "scripts/reproduce.py", config_file, f"--seeds {seeds}"]
    + (["--smoke"] if smoke else [])
    + list(extra)
  )


def run_environment(config_file, pool_name, workers, cpu_threads, started, run, command):
  """The environment record of an invocation (sweeps/environment.py)."""
  return environment.record(
    backend=pool_name,
    workers=workers,
    cpu_threads=cpu_threads,
    started=started,
    jobs_run=run.jobs_run,
    jobs_cached=run.jobs_cached,
    command=command,
  )


def reproduce(
  config_file: str,
  seeds: int,
  *,
  smoke: bool = False,
  out_dir: str | None = None,
  workers: int | None = None,
  backend: str = "local",
  ray_address: str | None = None,
  echo=print,
) -> str:
  """Runs the sweep (resuming whatever already ran) and writes the report; returns the table.
  ``backend``: ``local`` (``workers`` processes, 0: in this process) or ``ray`` (jobs as Ray
  tasks on the cluster at ``ray_address``; sweeps/runner.py). An invocation that ran a job
  appends its environment record to ``environment.jsonl``."""
  module = load_config_module(config_file)
  name = os.path.splitext(os.path.basename(config_file))[0]
  sweep = sweep_of(module, smoke)
  check_shared(module, sweep, smoke)
  out_dir = out_dir or os.path.join("results", name + ("_smoke" if smoke else ""))
  threads = cpu_threads_of(module, sweep, smoke)
  pool, workers = make_pool(backend, workers, ray_address, threads)
  started = environment.now()
  run = run_sweep(
    config_file, module, sweep, seeds=seeds, out_dir=out_dir, pool=pool, smoke=smoke, echo=echo
  )
  command = command_line(config_file, seeds, smoke)
  if not run.records:
    raise RuntimeError(
      f"no run of {config_file} finished ({len(run.failed)} failed); logs in "
      f"{os.path.join(out_dir, 'logs')}; the committed table in {out_dir} is left as it was"
    )
  if run.jobs_run:
    environment.append(
      out_dir, run_environment(config_file, backend, workers, threads, started, run, command)
    )
  else:
    environment.ensure(out_dir)
  retire_table(out_dir, run.records, module.__doc__)
  text = report.write_report(
    out_dir,
    sweep,
    run.records,
    command,
    setting=report.mechanism(module.__doc__),
    bases=run.bases,
    changed=report.changes(module.__doc__),
  )
  if run.failed:
    names = ", ".join(j.name for j in run.failed)
    raise RuntimeError(
      f"{len(run.failed)} run(s) failed: {names}; logs in {os.path.join(out_dir, 'logs')}; "
      "rerun the same command to resume them"
    )
  return text


def check(
  config_file: str,
  seeds: int = 1,
  *,
  smoke: bool = False,
  out_dir: str | None = None,
  workers: int | None = None,
  backend: str = "local",
  ray_address: str | None = None,
  echo=print,
) -> str:
  """Reruns the first ``seeds`` of the table's recorded seeds in ``out_dir``/check/ and writes
  rerun.json and rerun.md (sweeps/rerun_check.py), then rewrites table.md so its verdict
  states the check; returns rerun.md's text. A rerun already made there is reused (and, when
  nothing ran now, the environment it ran in kept)."""
  module = load_config_module(config_file)
  name = os.path.splitext(os.path.basename(config_file))[0]
  sweep = sweep_of(module, smoke)
  out_dir = out_dir or os.path.join("results", name + ("_smoke" if smoke else ""))
  path = os.path.join(out_dir, "runs.jsonl")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} does not exist: there is no table to check; run the sweep")
  recorded = ptio.read_jsonl(path)
  table_seeds = sorted({r["seed"] for r in recorded if r["arm"] == sweep.baseline})
  if seeds < 1:
    raise ValueError(f"--seeds must be >= 1 for a check, got {seeds}")
  chosen = table_seeds[:seeds]
  threads = cpu_threads_of(module, sweep, smoke)
  pool, workers = make_pool(backend, workers, ray_address, threads)
  started = environment.now()
  check_dir = os.path.join(out_dir, "check")
  run = run_sweep(
    config_file,
    module,
    sweep,
    seeds=len(chosen),
    out_dir=check_dir,
    pool=pool,
    smoke=smoke,
    seed_list=chosen,
    echo=echo,
  )
  if run.failed or not run.records:
    names = ", ".join(j.name for j in run.failed)
    raise RuntimeError(
      f"the rerun check of {config_file} failed ({names or 'no run finished'}); logs in "
      f"{os.path.join(check_dir, 'logs')}; rerun the same command to resume"
    )
  command = command_line(config_file, seeds, smoke, "--check")
  previous = rerun_check.read(out_dir)
  if run.jobs_run == 0 and previous is not None and previous.get("seeds") == list(chosen):
    # every rerun job was already done: this call re-summarises the runs the last check made,
    # whose environment is the one they ran in
    rerun_env = previous.get("environment", {})
  else:
    rerun_env = run_environment(config_file, backend, workers, threads, started, run, command)
  env = {
    "rerun_environment": rerun_env,
    "recorded_environment": rerun_check.last_environment(out_dir),
  }
  result = rerun_check.summarise(sweep, recorded, run.records, chosen, env)
  text = rerun_check.write(out_dir, sweep.title, result, command)
  if os.path.exists(os.path.join(out_dir, "table.md")) and hasattr(module, "get_config"):
    rewrite_report(config_file, smoke=smoke, out_dir=out_dir)
  return text


def cpu_threads_of(module, sweep, smoke: bool) -> int:
  """The baseline arm's ``config.cpu_threads`` (every arm shares the run section)."""
  if not hasattr(module, "get_config"):
    return 0
  return int(module.get_config(_arg(sweep.baseline, 0, smoke)).get("cpu_threads", 0))


def gate_from_runs(records: list[dict], gate, baseline: str) -> list[dict]:
  """The base-health gate checked after the runs, for a table made before its gate was
  declared: each seed's shared start is the baseline arm's recorded ``gate.metric`` (every arm
  of a seed starts from it). Nothing can be replaced without a rerun, so a seed below the
  floor stays in the table and is named (``source: runs``)."""
  out = []
  for r in sorted((r for r in records if r["arm"] == baseline), key=lambda r: r["seed"]):
    value = float(r.get(gate.metric, math.nan))
    out.append({**gate_record(gate, r["seed"], value, used_if_low=True), "source": "runs"})
  return out


def rewrite_report(
  config_file: str,
  *,
  smoke: bool = False,
  out_dir: str | None = None,
  gate_after_runs: bool = False,
) -> str:
  """Rewrites table.md from the runs already recorded in ``out_dir``/runs.jsonl and the
  config's current sweep text (title, notes, the setting sentence), without running anything
  or redrawing the curves; returns the table. ``config_file`` is an experiment config
  (``get_config``) or a simulation config (``sweep()``, scripts/libra.py).
  ``gate_after_runs``: write bases.jsonl from the recorded runs (:func:`gate_from_runs`)."""
  module = load_config_module(config_file)
  name = os.path.splitext(os.path.basename(config_file))[0]
  sweep = sweep_of(module, smoke)
  out_dir = out_dir or os.path.join("results", name + ("_smoke" if smoke else ""))
  path = os.path.join(out_dir, "runs.jsonl")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} does not exist: run the sweep first (without --report-only)")
  with open(path, encoding="utf-8") as f:
    records = [json.loads(line) for line in f if line.strip()]
  with open(os.path.join(out_dir, "command.txt"), encoding="utf-8") as f:
    command = f.read().strip()
  bases = []
  if gate_after_runs:
    if sweep.get("base_health", None) is None:
      raise ValueError(f"{config_file} declares no sweep.base_health to check")
    gate = sweep.base_health
    bases = gate_from_runs(records, gate, gate.get("arm", sweep.baseline))
    _write_bases(out_dir, bases)
  elif os.path.exists(os.path.join(out_dir, BASES)):
    bases = ptio.read_jsonl(os.path.join(out_dir, BASES))
  environment.ensure(out_dir)
  return report.write_report(
    out_dir,
    sweep,
    records,
    command,
    setting=report.mechanism(module.__doc__),
    curves=False,
    bases=bases,
    changed=report.changes(module.__doc__),
  )
