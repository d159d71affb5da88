"""Hyperparameter search over an experiment config with Optuna (``scripts/hpo.py``).

A study searches the space its config's ``hpo`` section declares (:data:`SETTINGS`); each
trial is a run of the same experiment file with the trial's values as config overrides::

    c.hpo = dict(
      space=dict(rl=dict(
        lr=dict(low=1e-5, high=3e-3, log=True),        # a float (log scale)
        group_size=dict(choices=(4, 8, 16)),           # a categorical
        epochs=dict(low=1, high=4, step=1),            # an int (integer bounds)
      )),
      variants=dict(target={}, proxy=dict(model=dict(preset="nano"))),
      rungs=(dict(variant="proxy", steps=20), dict(variant="proxy", steps=60),
             dict(variant="target", steps=60)),
    )

Fidelity is the pair (model variant, RL steps) of each rung (JF-HPO, methods_A.md section
12). A trial climbs the rungs in order; after each it reports the rung's value (the RL curve's
``metric`` at the rung's last step) to Optuna at step ``eta**k``, where a successive-halving
pruner keeps the top ``1/eta`` of the trials that reached rung k, and the early-stop rules of
``hpo.early_stop`` (sweeps/early_stop.py) read its training curve. Promotion along steps
continues the trial's run from its checkpoint (``config.rl.pause_after``: the run is the
uninterrupted run of the variant's last rung, paused), so the curve is exactly the one a
trial run straight through would have; promotion to another variant starts that variant's
run from its own pretrained base. The value of a trial is that of its last rung.

The study lives in ``STUDY_DIR/study.db`` (SQLite, Optuna's RDB storage): a study killed at
any point (kill -9 included) resumes when rerun with the same command: finished rungs are
not run again, the trial in flight resumes from its checkpoint, and each trial's sampler is
seeded by (``seed``, trial number), so the resumed study asks the same trials an uninterrupted
one would. Budgets are CPU-seconds of the trials' runs (pretraining the shared bases is not
charged): a rung is not started when the rate measured on the variant's earlier rungs says it
would pass ``budget_s``.
"""

import dataclasses
import fcntl
import json
import math
import os
import sys
import warnings

from posttrain_jax.sweeps import early_stop, hpo_report, runner

STUDY_DB = "study.db"
# The hpo section: every key with its default (an experiment file sets the keys it changes).
SETTINGS = dict(
  space={},  # config path -> dict(low, high[, log, step]) or dict(choices=(...)), nested
  metric="eval/accuracy",  # an RL record key, read at each rung's last step
  direction="maximize",
  sampler="tpe",  # tpe | random
  startup_trials=4,  # TPE: random trials before the model is used
  variants={"target": {}},  # fidelity by size: name -> config overrides (nested sections)
  rungs=({"variant": "target", "steps": 0},),  # 0 steps: the config's rl.steps
  eta=3,  # successive halving: the top 1/eta of a rung go on
  prune=True,  # False: every trial climbs every rung (no successive halving)
  early_stop={},  # rule -> kwargs (sweeps/early_stop.py)
  trials=0,  # stop after this many finished trials (0: no limit)
  budget_s=0.0,  # stop when the trials' CPU-seconds would pass this (0: no limit)
  seed=0,  # the samplers' seed (trial n's sampler is seeded by seed and n)
  shared=("pretrain",),  # stages each variant's base runs once, linked into every trial
  bases="study",  # "study": bases in STUDY_DIR/bases; "parent": beside the study (shared)
)


def settings_of(config) -> dict:
  """The study settings of ``config.hpo`` over :data:`SETTINGS`; an unknown key is a
  ValueError naming the valid ones."""
  given = config.hpo.to_dict() if "hpo" in config else {}
  unknown = sorted(set(given) - set(SETTINGS))
  if unknown:
    raise ValueError(f"config.hpo has unknown key(s) {unknown}; valid keys: {', '.join(SETTINGS)}")
  s = {**SETTINGS, **given}
  if s["sampler"] not in ("tpe", "random"):
    raise ValueError(f"config.hpo.sampler must be 'tpe' or 'random', got {s['sampler']!r}")
  if s["direction"] not in ("maximize", "minimize"):
    raise ValueError(f"config.hpo.direction must be maximize or minimize, got {s['direction']!r}")
  steps = {}
  rungs = []
  for i, r in enumerate(s["rungs"]):
    r = {"variant": "target", **dict(r)}
    if r["variant"] not in s["variants"]:
      raise ValueError(
        f"config.hpo.rungs[{i}] names variant {r['variant']!r}; declared: {sorted(s['variants'])}"
      )
    r["steps"] = int(r["steps"]) or int(config.rl.steps)
    if r["steps"] < steps.get(r["variant"], 0):
      raise ValueError(f"config.hpo.rungs[{i}]: a variant's rungs must not go down in steps")
    steps[r["variant"]] = r["steps"]
    rungs.append(r)
  s["rungs"] = rungs
  s["max_steps"] = steps  # each variant's run: its last rung's steps
  flat_space(s["space"])  # checks every distribution
  return s


def flat_space(space: dict, prefix: str = "") -> dict:
  """``{"rl": {"lr": spec}}`` -> ``{"rl.lr": spec}``; a spec is a dict with ``low`` and
  ``high`` (``log``, ``step`` optional; integer bounds give an int) or ``choices``."""
  out = {}
  for key, value in dict(space).items():
    name = f"{prefix}{key}"
    value = dict(value)
    if "choices" in value or "low" in value:
      if "choices" in value and not value["choices"]:
        raise ValueError(f"hpo.space.{name}: choices is empty")
      if "low" in value and not value.get("high", value["low"]) > value["low"]:
        raise ValueError(f"hpo.space.{name}: needs high > low, got {value}")
      out[name] = value
    elif value:
      out.update(flat_space(value, name + "."))
    else:
      raise ValueError(f"hpo.space.{name} is empty; give dict(low, high) or dict(choices)")
  return out


def suggest(trial, space: dict) -> dict:
  """The trial's value of every parameter of ``space`` (a resumed trial's stored values)."""
  values = {}
  for name, spec in flat_space(space).items():
    if "choices" in spec:
      values[name] = trial.suggest_categorical(name, list(spec["choices"]))
    elif isinstance(spec["low"], int) and isinstance(spec["high"], int) and not spec.get("log"):
      values[name] = trial.suggest_int(name, spec["low"], spec["high"], step=spec.get("step", 1))
    else:
      values[name] = trial.suggest_float(
        name, float(spec["low"]), float(spec["high"]), log=bool(spec.get("log", False))
      )
  return values


def flat_overrides(tree: dict, prefix: str = "") -> dict:
  out = {}
  for key, value in dict(tree).items():
    if isinstance(value, dict) or hasattr(value, "to_dict"):
      out.update(flat_overrides(dict(value), f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def flags(values: dict) -> tuple:
  """Config overrides as ``--config.KEY=VALUE`` flags (a string value as is, others repr)."""
  return tuple(f"--config.{k}={v if isinstance(v, str) else repr(v)}" for k, v in values.items())


@dataclasses.dataclass
class Study:
  """What one study needs: the experiment (``config_file``, ``config_arg``), its settings,
  its folder and the backend its runs go through."""

  config_file: str
  config_arg: str
  settings: dict
  study_dir: str
  backend: object
  echo: object = print
  seed: int = 0  # the runs' config.seed (the summary's seed)
  made: set = dataclasses.field(default_factory=set)  # variants whose base is ready

  @property
  def bases_dir(self) -> str:
    if self.settings["bases"] == "parent":
      return os.path.join(os.path.dirname(os.path.abspath(self.study_dir)), "bases")
    return os.path.join(self.study_dir, "bases")

  def variant_flags(self, variant: str) -> tuple:
    return flags(flat_overrides(self.settings["variants"][variant]))

  def base(self, variant: str) -> str:
    """The variant's base (its shared stages), made once under a lock (studies side by side,
    e.g. a reproduction's arms, share it)."""
    shared = tuple(self.settings["shared"])
    path = os.path.join(self.bases_dir, variant)
    if not shared or variant in self.made:  # checked once per study, not once per rung
      return path
    os.makedirs(self.bases_dir, exist_ok=True)
    job = runner.Job(
      f"base_{variant}",
      self.config_file,
      self.config_arg,
      path,
      (*self.variant_flags(variant), f"--config.stages={shared!r}"),
      done_file=os.path.join(shared[-1], "done.json"),
    )
    with open(path + ".lock", "w", encoding="utf-8") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      ((_, code, _),) = runner.run_all(
        [job], backend=self.backend, log_dir=self.log_dir, echo=lambda line: None
      )
    if code:
      raise RuntimeError(
        f"the {variant} base failed (exit {code}); see {self.log_dir}/{job.name}.log"
      )
    self.made.add(variant)
    return path

  @property
  def log_dir(self) -> str:
    return os.path.join(self.study_dir, "logs")

  def rung_job(self, number: int, params: dict, rung: dict) -> runner.Job:
    variant, steps = rung["variant"], rung["steps"]
    last = self.settings["max_steps"][variant]
    workdir = os.path.join(self.study_dir, "trials", f"{number:04d}", variant)
    runner.link_shared_stages(self.base(variant), workdir, tuple(self.settings["shared"]))
    return runner.Job(
      f"trial{number:04d}_{variant}_{steps}",
      self.config_file,
      self.config_arg,
      workdir,
      (
        *self.variant_flags(variant),
        *flags(params),
        f"--config.stages={(*self.settings['shared'], 'rl')!r}",
        f"--config.rl.steps={last}",
        f"--config.rl.pause_after={steps if steps < last else 0}",
      ),
      done_file=f"rung{steps}.json",
    )


def curve(workdir: str, steps: int) -> list[dict]:
  """The RL records of the run in ``workdir`` up to step ``steps``."""
  path = os.path.join(workdir, "rl", "metrics.jsonl")
  with open(path, encoding="utf-8") as f:
    return [r for r in map(json.loads, filter(str.strip, f)) if r["step"] <= steps]


def run_rung(study: Study, number: int, params: dict, rung: dict) -> dict:
  """Runs (or reads, when it finished before) one rung of trial ``number``: its value, the
  CPU-seconds its run took and the early-stop reason (None: go on)."""
  job = study.rung_job(number, params, rung)
  marker = os.path.join(job.workdir, job.done_file)
  if os.path.exists(marker):
    with open(marker, encoding="utf-8") as f:
      return json.load(f)
  ((_, code, _),) = runner.run_all(
    [job], backend=study.backend, log_dir=study.log_dir, echo=lambda _: None
  )
  if code:
    raise RuntimeError(
      f"trial {number}'s {rung['variant']} run failed (exit {code}); see {study.log_dir}/{job.name}.log"
    )
  cpu = runner.wall_seconds(job.workdir, "cpu_s")
  records = curve(job.workdir, rung["steps"])
  at = [r for r in records if r["step"] == rung["steps"] and study.settings["metric"] in r]
  if not at:
    raise ValueError(
      f"trial {number}: the RL records of {job.workdir} have no {study.settings['metric']!r} at "
      f"step {rung['steps']}; name a key the RL records carry at a rung's last step"
    )
  value = float(at[0][study.settings["metric"]])
  reason = early_stop.check(records, study.settings["early_stop"])
  if not math.isfinite(value):
    reason = reason or f"non-finite {study.settings['metric']}"
  out = {"value": value, "cpu_s": cpu, "stop": reason, **rung}
  with open(marker, "w", encoding="utf-8") as f:
    json.dump(out, f)
  return out


def sampler_for(settings: dict, number: int):
  """Trial ``number``'s sampler, seeded by (seed, number): the same study history gives the
  same trial, also after a resume."""
  import optuna  # pylint: disable=import-outside-toplevel

  seed = settings["seed"] * 100_003 + number
  if settings["sampler"] == "random":
    return optuna.samplers.RandomSampler(seed=seed)
  return optuna.samplers.TPESampler(seed=seed, n_startup_trials=settings["startup_trials"])


def load(study_dir: str, settings: dict, number: int):
  import optuna  # pylint: disable=import-outside-toplevel

  pruner = optuna.pruners.SuccessiveHalvingPruner(
    min_resource=1, reduction_factor=settings["eta"], min_early_stopping_rate=0
  )
  return optuna.create_study(
    study_name="hpo",
    storage=f"sqlite:///{os.path.abspath(os.path.join(study_dir, STUDY_DB))}",
    sampler=sampler_for(settings, number),
    pruner=pruner if settings["prune"] else optuna.pruners.NopPruner(),
    direction=settings["direction"],
    load_if_exists=True,
  )


def _fingerprint(settings: dict) -> str:
  keep = {k: v for k, v in settings.items() if k not in ("trials", "budget_s")}
  return json.dumps(keep, sort_keys=True, default=str)


def spent(study) -> float:
  """CPU-seconds of every rung run so far."""
  return sum(t.user_attrs.get("cpu_s", 0.0) for t in study.get_trials(deepcopy=False))


def estimate(study, variant: str, steps_from: int, steps_to: int) -> float | None:
  """The CPU-seconds a rung of ``variant`` from ``steps_from`` to ``steps_to`` steps should take:
  the slowest rate (seconds per step) of the variant's rungs so far; None before any ran."""
  rates = [
    r["cpu_s"] / max(r["steps"] - r["from"], 1)
    for t in study.get_trials(deepcopy=False)
    for r in t.user_attrs.get("rungs", [])
    if r["variant"] == variant
  ]
  return max(rates) * (steps_to - steps_from) if rates else None


def run_trial(study_obj, trial, study: Study) -> str:
  """Climbs the rungs for ``trial`` (resuming the rungs it finished); returns its end state
  (``complete``, ``pruned``, ``stopped`` or ``budget``)."""
  import optuna  # pylint: disable=import-outside-toplevel

  s = study.settings
  params = suggest(trial, s["space"])
  rungs, done = list(trial.user_attrs.get("rungs", [])), {}
  for k, rung in enumerate(s["rungs"]):
    prior = [r for r in s["rungs"][:k] if r["variant"] == rung["variant"]]
    start = prior[-1]["steps"] if prior else 0
    if k < len(rungs):
      result = rungs[k]
    else:
      cost = estimate(study_obj, rung["variant"], start, rung["steps"])
      if s["budget_s"] and (
        spent(study_obj) >= s["budget_s"]
        or (cost is not None and spent(study_obj) + cost > s["budget_s"])
      ):
        trial.set_user_attr("stopped_by", "budget")
        study_obj.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return "budget"
      result = {**run_rung(study, trial.number, params, rung), "from": start}
      rungs.append(result)
      trial.set_user_attr("rungs", rungs)
      trial.set_user_attr("cpu_s", sum(r["cpu_s"] for r in rungs))
    done = result
    trial.report(result["value"], step=s["eta"] ** k)
    study.echo(
      f"[hpo] trial {trial.number} rung {k} ({rung['variant']}, {rung['steps']} steps): "
      f"{s['metric']} {result['value']:.4f}, {result['cpu_s']:.0f} CPU-s"
      f" [spent {spent(study_obj):.0f}" + (f"/{s['budget_s']:.0f}" if s["budget_s"] else "") + " s]"
    )
    if result["stop"]:
      trial.set_user_attr("stopped_by", result["stop"])
      study_obj.tell(trial, state=optuna.trial.TrialState.PRUNED)
      study.echo(f"[hpo] trial {trial.number} stopped: {result['stop']}")
      return "stopped"
    if k < len(s["rungs"]) - 1 and s["prune"] and trial.should_prune():
      trial.set_user_attr("stopped_by", f"pruned at rung {k}")
      study_obj.tell(trial, state=optuna.trial.TrialState.PRUNED)
      return "pruned"
  study_obj.tell(trial, done["value"])
  return "complete"


def run_study(study: Study) -> dict:
  """Runs (or resumes) the study until ``trials`` trials finished or the budget is spent, then
  writes the report (:func:`report`); returns the summary."""
  import optuna  # pylint: disable=import-outside-toplevel

  optuna.logging.set_verbosity(optuna.logging.WARNING)
  warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
  s = study.settings
  if not (s["trials"] or s["budget_s"]):
    raise ValueError("a study needs a limit: set hpo.trials or hpo.budget_s (--trials, --budget)")
  os.makedirs(study.study_dir, exist_ok=True)
  with open(os.path.join(study.study_dir, ".lock"), "w", encoding="utf-8") as lock:
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise RuntimeError(f"another study is running in {study.study_dir}") from None
    first = load(study.study_dir, s, 0)
    stored = first.user_attrs.get("settings")
    if stored is None:
      first.set_user_attr("settings", _fingerprint(s))
    elif stored != _fingerprint(s):
      raise ValueError(
        f"the study in {study.study_dir} was made with other settings (space, rungs, sampler, "
        "seed or rules); use another output folder, or the settings it was made with"
      )
    while True:
      trials = first.get_trials(deepcopy=False)
      running = [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
      finished = [t for t in trials if t.state.is_finished()]
      if any(t.user_attrs.get("stopped_by") == "budget" for t in finished):
        break
      if not running and s["trials"] and len(finished) >= s["trials"]:
        break
      number = running[0].number if running else len(trials)
      current = load(study.study_dir, s, number)
      trial = optuna.trial.Trial(current, running[0]._trial_id) if running else current.ask()
      if run_trial(current, trial, study) == "budget":
        break
  return hpo_report.report(load(study.study_dir, s, 0), study)


def run_in_process(job: runner.Job) -> dict:
  """The study of a reproduction job (``Job.module == runner.STUDY``): the job's config file
  and arg, its workdir as the study folder, in this process (its rungs too)."""
  config = runner.job_config(job)
  study = Study(
    job.config_file,
    job.config_arg,
    settings_of(config),
    job.workdir,
    runner.LocalBackend(0),
    seed=int(config.seed),
  )
  return run_study(study)


def main(argv: list[str]) -> int:
  """``python -m posttrain_jax.sweeps.hpo --config=FILE:ARG --workdir=DIR [--config.K=V ...]``:
  what a reproduction's study job runs (scripts/hpo.py is the command for people)."""
  args = dict(a.split("=", 1) for a in argv if a.startswith("--") and "=" in a)
  file, _, arg = args["--config"].partition(":")
  overrides = tuple(a for a in argv if a.startswith("--config.") and "=" in a)
  job = runner.Job("study", file, arg, args["--workdir"], overrides, module=runner.STUDY)
  try:
    run_in_process(job)
  except (ValueError, RuntimeError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
