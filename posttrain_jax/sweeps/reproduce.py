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

from posttrain_jax import defaults
from posttrain_jax import io as ptio
from posttrain_jax.sweeps import report, runner
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


def _commit() -> str:
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
  tasks on the cluster at ``ray_address``; sweeps/runner.py)."""
  module = load_config_module(config_file)
  name = os.path.splitext(os.path.basename(config_file))[0]
  sweep = sweep_of(module, smoke)
  check_shared(module, sweep, smoke)
  out_dir = out_dir or os.path.join("results", name + ("_smoke" if smoke else ""))
  runs_dir, log_dir = os.path.join(out_dir, "runs"), os.path.join(out_dir, "logs")
  workers = max(1, os.cpu_count() or 1) if workers is None else workers
  if workers < 0:
    raise ValueError(
      f"workers must be >= 0 (0: one run after another in this process), got {workers}"
    )
  pool = runner.make_backend(backend, workers=workers, address=ray_address)
  shared = tuple(sweep.shared_stages)
  gate = sweep.get("base_health", None)
  if gate is not None and not shared:
    raise ValueError(f"{config_file}: sweep.base_health needs shared stages to check")

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
      (f"--config.stages={stages!r}",),
      done_file=done,
    )

  # --- 1. shared stages, once per seed (and the base-health gate) -----------------------------
  echo(f"[{name}] shared stages {shared} for {seeds} seeds")

  def run_bases(candidates):
    results = runner.run_all(
      [base_job(s) for s in candidates], backend=pool, log_dir=log_dir, echo=echo
    )
    return [j for j, code, _ in results if code]

  studies = sweep.get("program", "run") == "study"  # each job a study that makes its bases
  if studies:
    failed, seed_list, bases = [], list(range(seeds)), []
  elif gate is None:
    failed, seed_list, bases = run_bases(range(seeds)), list(range(seeds)), []
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
          f"seed{seed}_{arm}", config_file, _arg(arm, seed, smoke), workdir, module=program
        )
      )
  echo(
    f"[{name}] {len(jobs)} runs ({len(sweep.arms)} arms x {len(seed_list)} seeds), "
    + pool.describe()
  )
  results = runner.run_all(jobs, backend=pool, log_dir=log_dir, echo=echo)
  failed += [j for j, code, _ in results if code]
  # --- 3. report -------------------------------------------------------------------------------
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
  command = " ".join(
    [
      "python",
      "scripts/reproduce.py",
      config_file,
      f"--seeds {seeds}",
      *(["--smoke"] if smoke else []),
    ]
  )
  if not records:
    raise RuntimeError(
      f"no run of {config_file} finished ({len(failed)} failed); logs in {log_dir}; the "
      f"committed table in {out_dir} is left as it was"
    )
  if _changed(out_dir, records):  # the table about to be replaced moves to history.md
    report.archive(
      out_dir,
      report.paragraph(module.__doc__, report.CHANGED),
      when=datetime.date.today().isoformat(),
      commit=_commit(),
    )
  text = report.write_report(
    out_dir,
    sweep,
    records,
    command,
    setting=report.mechanism(module.__doc__),
    bases=bases,
    changed=report.changes(module.__doc__),
  )
  if failed:
    names = ", ".join(j.name for j in failed)
    raise RuntimeError(
      f"{len(failed)} run(s) failed: {names}; logs in {log_dir}; rerun the "
      "same command to resume them"
    )
  return text


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
