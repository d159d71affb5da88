"""The table of stages (train/stages.py): plans, the wiring of starts and per-stage configs, and a
six-stage pipeline (two RL stages on different envs, an eval after each, a modelop between) that
runs, resumes after kill -9 and reruns per named stage."""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import time

import jax
import numpy as np
import pytest

from posttrain_jax import defaults
from posttrain_jax import methods as methods_lib
from posttrain_jax.methods import validate
from posttrain_jax.sweeps import runner
from posttrain_jax.train import ConfigError
from posttrain_jax.train import stages as stages_lib
from posttrain_jax.train import workdir as workdir_lib
from tests.faults import faults_workdir_helpers as h

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PIPELINE = "experiments/pipeline.py:smoke"
NAMES = ("pretrain", "rl_add", "eval_add", "merge", "rl_sum", "eval")


def _pipeline(**specs):
  c = runner.load_config_module(os.path.join(REPO, "experiments", "pipeline.py")).get_config(
    "smoke"
  )
  c.progress = False
  for name, spec in specs.items():
    c.stage_specs[name] = spec
  return c


def _quickstart(*stages, **specs):
  c = runner.load_config_module(os.path.join(REPO, "experiments", "quickstart.py")).get_config(
    "smoke"
  )
  c.stages = stages
  c.stage_specs = specs
  return c


# -- plans ----------------------------------------------------------------------------------------
def test_plan_of_the_pipeline_names_kinds_starts_and_per_stage_configs():
  c = _pipeline()
  validate(c)
  plan = stages_lib.plan(c)
  assert [(s.name, s.kind, s.start) for s in plan] == [
    ("pretrain", "pretrain", "init"),
    ("rl_add", "rl", "pretrain"),
    ("eval_add", "eval", "rl_add"),
    ("merge", "modelop", "pretrain"),
    ("rl_sum", "rl", "merge"),
    ("eval", "eval", "rl_sum"),
  ]
  assert plan[3].inputs == ("pretrain", "rl_add")
  envs = [s.config.env.name for s in plan]
  assert envs == ["arithmetic"] * 4 + ["digit_sum"] * 2
  assert plan[0].config is c  # a stage without overrides runs with the run's own config
  assert plan[4].config.rl.steps == 2 and plan[4].config.rl.lr == c.rl.lr
  assert tuple(plan[5].config.eval.extra_envs) == ("arithmetic",)
  assert tuple(c.eval.extra_envs) == ()  # overrides never leak into the run's config


def test_legacy_lists_of_kinds_plan_as_before():
  c = _quickstart("pretrain", "teacher", "rl", "eval")
  c.rl.teacher.update(source="stage", preset="nano", loss="forward")
  plan = stages_lib.plan(validate_and_return(c))
  assert [(s.name, s.start) for s in plan] == [
    ("pretrain", "init"),
    ("teacher", "pretrain"),
    ("rl", "pretrain"),
    ("eval", "rl"),
  ]
  plan = stages_lib.plan(validate_and_return(_quickstart("rl", "eval")))
  assert [(s.name, s.start) for s in plan] == [("rl", "init"), ("eval", "rl")]


def validate_and_return(c):
  validate(c)
  return c


@pytest.mark.parametrize(
  "stages,specs,message",
  [
    (("pretrain", "rl", "rl"), {}, r"names \['rl'\] more than once"),
    (("pretrain", "rl_b"), {}, r"'rl_b', which is no kind of stage and has no spec; add "),
    (("pretrain", "x"), {"x": {"kind": "sft2"}}, r"x.kind='sft2' is no kind of stage"),
    (("pretrain", "x"), {"x": {"kind": "rl", "steps": 3}}, r"x has unknown key\(s\) \['steps'\]"),
    (("pretrain", "t2"), {"t2": {"kind": "teacher"}}, r"a teacher stage must be named 'teacher'"),
    (
      ("pretrain", "x", "y"),
      {"x": {"kind": "rl"}, "y": {"kind": "rl", "start": "eval"}},
      r"y.start='eval' is not an earlier stage that makes a policy; earlier ones: "
      r"\['pretrain', 'x'\]",
    ),
    (
      ("pretrain", "m"),
      {"m": {"kind": "modelop", "op": "blend", "inputs": ("pretrain",)}},
      r"m.op='blend' is no model operator; valid ops: average",
    ),
    (
      ("pretrain", "m"),
      {"m": {"kind": "modelop", "op": "average", "inputs": ("pretrain", "rl")}},
      r"m.inputs has \['rl'\], not earlier stages",
    ),
    (
      ("pretrain", "x"),
      {"x": {"kind": "rl", "overrides": {"model": {"preset": "tiny"}}}},
      r"x.overrides sets \['model'\], which every stage shares",
    ),
    (
      ("pretrain", "x"),
      {"x": {"kind": "rl", "overrides": {"rll": {"lr": 1.0}}}},
      r"x.overrides sets unknown key\(s\) \['rll'\]",
    ),
    (
      ("pretrain", "x"),
      {"x": {"kind": "rl", "overrides": {"rl": {"lr": -1.0}}}},
      r"^stage x \(config.stage_specs.x.overrides\): config.rl.lr",
    ),
    (
      ("pretrain", "x"),
      {"x": {"kind": "rl", "overrides": {"env": {"name": "nope"}}}},
      r"^stage x \(config.stage_specs.x.overrides\): config.env.name='nope' is unknown",
    ),
  ],
)
def test_bad_plans_are_refused_naming_the_stage_and_the_fix(stages, specs, message):
  with pytest.raises(ConfigError, match=message):
    validate(_quickstart(*stages, **specs))


def test_run_plan_hands_each_stage_its_start_and_its_config(monkeypatch):
  """The engine's loop with every kind replaced by a recorder: each stage gets the parameters
  of the stage it starts from and a context built from its own config."""
  seen = []

  def recorder(makes):
    def run(ctx, stage, done):
      seen.append(
        (
          stage.name,
          done.params[stage.start]
          if stage.kind != "modelop"
          else [done.params[n] for n in stage.inputs],
          ctx.config.env.name,
          ctx.env.name,
        )
      )
      return f"params:{stage.name}" if makes else None

    return run

  table = {
    k: dataclasses.replace(v, run=recorder(v.makes_policy)) for k, v in stages_lib.STAGES.items()
  }
  monkeypatch.setattr(stages_lib, "STAGES", table)
  c = _pipeline()
  validate(c)

  class Env:
    def __init__(self, name):
      self.name = name

  ctx = _FakeContext(config=c, init_params="params:init")
  monkeypatch.setattr(
    stages_lib.context_lib,
    "for_stage",
    lambda ctx, cfg: dataclasses.replace(ctx, config=cfg, env=Env(cfg.env.name)),
  )
  ctx.env = Env(c.env.name)
  stages_lib.run_plan(ctx)
  assert seen == [
    ("pretrain", "params:init", "arithmetic", "arithmetic"),
    ("rl_add", "params:pretrain", "arithmetic", "arithmetic"),
    ("eval_add", "params:rl_add", "arithmetic", "arithmetic"),
    ("merge", ["params:pretrain", "params:rl_add"], "arithmetic", "arithmetic"),
    ("rl_sum", "params:merge", "digit_sum", "digit_sum"),
    ("eval", "params:rl_sum", "digit_sum", "digit_sum"),
  ]


@dataclasses.dataclass
class _FakeContext:
  config: object
  init_params: object
  env: object = None


# -- the pipeline, run --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
  """An uninterrupted in-process run of experiments/pipeline.py:smoke: (workdir, summary)."""
  workdir = tmp_path_factory.mktemp("pipeline")
  return workdir, methods_lib.run(_pipeline(), str(workdir))


def _records(path):
  with open(path, encoding="utf-8") as f:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")} for line in f]


def _done(workdir, name):
  with open(os.path.join(workdir, name, "done.json"), encoding="utf-8") as f:
    return json.load(f)


def _final(workdir, name):
  from posttrain_jax.train import experiment  # pylint: disable=import-outside-toplevel

  return experiment.load_final(str(workdir), name)[0]


def test_pipeline_runs_every_stage_on_its_own_env_and_merges_exactly(pipeline_run):
  workdir, summary = pipeline_run
  for name in NAMES:
    assert os.path.exists(workdir / name / "done.json"), name
  assert json.loads((workdir / "stages.json").read_text()) == {
    name: list(NAMES[:i]) for i, name in enumerate(NAMES)
  }
  first, last = _done(workdir, "eval_add"), _done(workdir, "eval")
  assert (first["env"], last["env"]) == ("arithmetic", "digit_sum")
  assert summary == last == json.loads((workdir / "summary.json").read_text())
  # the last evaluation also scores the first domain (its overrides' eval.extra_envs)
  assert "accuracy_arithmetic_after_rl" in last and "accuracy_arithmetic_after_rl" not in first
  # each evaluation summarises its own RL stage's curve
  rl_add, rl_sum = (
    _records(workdir / "rl_add" / "metrics.jsonl"),
    _records(workdir / "rl_sum" / "metrics.jsonl"),
  )
  for done, recs in ((first, rl_add), (last, rl_sum)):
    rewards = [r["reward/mean"] for r in recs if "reward/mean" in r]
    assert done["rl_reward_mean"] == pytest.approx(sum(rewards) / len(rewards))
  pre, rl, merged = (_final(workdir, n) for n in ("pretrain", "rl_add", "merge"))
  expected = jax.tree.map(lambda a, b: 0.5 * np.asarray(a) + 0.5 * np.asarray(b), pre, rl)
  moved = 0.0
  for got, want, a, b in zip(
    jax.tree.leaves(merged), jax.tree.leaves(expected), jax.tree.leaves(pre), jax.tree.leaves(rl)
  ):
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-7)
    moved += float(np.sum((np.asarray(b, np.float64) - np.asarray(a, np.float64)) ** 2))
  assert moved > 0  # RL moved the parameters, so the merge is a point of its own
  assert _done(workdir, "merge")["distance_from_start"] == pytest.approx(
    0.5 * np.sqrt(moved), rel=1e-4
  )


def _cmd(workdir, *args):
  return h.cmd(workdir, *args, config=PIPELINE)


def test_pipeline_killed_in_its_second_rl_stage_resumes_to_the_same_results(pipeline_run, tmp_path):
  reference, _ = pipeline_run
  workdir = tmp_path / "w"
  proc = subprocess.Popen(
    _cmd(workdir), cwd=REPO, env=h.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
  )
  deadline = time.time() + 600
  while not (workdir / "rl_sum" / "metrics.jsonl").exists() and proc.poll() is None:
    assert time.time() < deadline
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert not (workdir / "eval" / "done.json").exists()  # killed before the end
  done = subprocess.run(_cmd(workdir), cwd=REPO, env=h.env(), capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-3000:]
  for name in ("pretrain", "rl_add", "merge"):  # finished before the kill: loaded, not rerun
    assert f"[{name}] already finished" in done.stderr
  for name in ("pretrain", "rl_add", "rl_sum"):
    assert _records(workdir / name / "metrics.jsonl") == _records(
      reference / name / "metrics.jsonl"
    ), name
  for name in ("eval_add", "merge", "eval"):
    assert _done(workdir, name) == _done(reference, name), name


def test_a_changed_stage_spec_reruns_that_stage_and_the_later_ones_only(pipeline_run, tmp_path):
  reference, _ = pipeline_run
  workdir = tmp_path / "w"
  shutil.copytree(reference, workdir)
  c = _pipeline()
  c.stage_specs.rl_sum.overrides.rl.lr = 1e-3
  validate(c)
  with pytest.raises(ConfigError) as e:
    workdir_lib.reconcile(str(workdir), c)
  assert str(e.value) == (
    f"workdir {workdir} was made with a different config: stage_specs.rl_sum.overrides.rl.lr "
    "(unset) -> 0.001; pass --rerun to rerun the stages they affect (rl_sum, eval), or use "
    "another --workdir"
  )
  kept = {n: _tree(workdir / n) for n in ("pretrain", "rl_add", "merge", "tokenizer")}
  summary = methods_lib.run(c, str(workdir), rerun=True)
  for name, files in kept.items():  # earlier stages untouched
    assert _tree(workdir / name) == files, name
  (stamp,) = os.listdir(workdir / "replaced")
  assert sorted(os.listdir(workdir / "replaced" / stamp)) == [
    "config.json",
    "curves.png",
    "eval",
    "rl_sum",
    "summary.json",
  ]
  new, old = (
    _records(workdir / "rl_sum" / "metrics.jsonl"),
    _records(reference / "rl_sum" / "metrics.jsonl"),
  )
  assert new[0] == old[0]  # the same start (the merge) evaluated before the first update
  assert new[-1] != old[-1]  # and a different learning rate after it
  assert summary == _done(workdir, "eval") != _done(reference, "eval")


def test_stage_settings_are_what_a_shared_stage_must_agree_on(pipeline_run, tmp_path):
  """A workdir whose pretraining is done accepts a config that differs only outside
  ``stage_settings(c, 'pretrain')`` and refuses one that differs inside (eval.precision is in:
  pretraining evaluates)."""
  c = _pipeline()
  settings = workdir_lib.stage_settings(c, "pretrain", root=defaults.ROOT)
  assert "pretrain.lr" in settings and "eval.precision" in settings and "model.preset" in settings
  assert "rl.lr" not in settings and "rl.save.enabled" not in settings  # a method's RL setting
  assert workdir_lib.stage_settings(c, "rl_add", root=defaults.ROOT).keys() > settings.keys()
  with pytest.raises(ValueError, match="not one of the config's stages"):
    workdir_lib.stage_settings(c, "sft", root=defaults.ROOT)
  reference, _ = pipeline_run
  workdir = tmp_path / "w"
  os.makedirs(workdir)
  for name in ("pretrain", "tokenizer", "config.json"):
    src = os.path.join(reference, name)
    (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, workdir / name)
  outside = _pipeline()
  outside.rl.lr, outside.stages = 0.123, ("pretrain",)
  validate(outside)
  assert workdir_lib.stage_settings(outside, "pretrain", root=defaults.ROOT) == settings
  workdir_lib.reconcile(str(workdir), outside, root=defaults.ROOT)  # accepted
  inside = _pipeline()
  inside.eval.precision, inside.stages = "bfloat16", ("pretrain",)
  validate(inside)
  assert workdir_lib.stage_settings(inside, "pretrain", root=defaults.ROOT) != settings
  with pytest.raises(ConfigError, match="eval.precision"):
    workdir_lib.reconcile(str(workdir), inside, root=defaults.ROOT)


def _tree(root):
  out = {}
  for dirpath, _, files in os.walk(root):
    for name in files:
      path = os.path.join(dirpath, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, root)] = f.read()
  return out


def test_an_added_stage_whose_env_needs_new_characters_is_refused(pipeline_run, tmp_path):
  """The workdir's tokenizer was made for the first run's envs; a stage on an env with other
  characters cannot use it and is refused before anything runs."""
  reference, _ = pipeline_run
  workdir = tmp_path / "w"
  shutil.copytree(reference, workdir)
  c = _pipeline(rl_tron=dict(kind="rl", overrides=dict(env=dict(name="tron/parity", level=1))))
  c.stages = tuple(c.stages) + ("rl_tron",)
  before = _tree(workdir)
  with pytest.raises(ConfigError, match=r"lacks characters .* run this config in another"):
    methods_lib.run(c, str(workdir))
  remembered = ("config.json", "stages.json", ".lock")  # the new spec, before any of it ran
  assert {k: v for k, v in _tree(workdir).items() if k not in remembered} == {
    k: v for k, v in before.items() if k not in remembered
  }
