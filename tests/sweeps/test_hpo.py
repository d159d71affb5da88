"""The hyperparameter study (sweeps/hpo.py): settings, the search space, JF-HPO's early-stop
rules, the CPU-second budget, a study killed with SIGKILL resuming to the same trials, and
promotion continuing a trial's run exactly."""

import json
import os
import signal
import subprocess
import sys
import time

import ml_collections
import numpy as np
import pytest

from posttrain_jax.sweeps import early_stop, hpo, runner

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
QUICKSTART = os.path.join(REPO, "experiments", "quickstart.py")


def _config(**hpo_section):
  c = ml_collections.ConfigDict({"seed": 0, "rl": {"steps": 40}})
  c.hpo = hpo_section
  return c


def test_settings_fill_defaults_and_name_bad_keys():
  s = hpo.settings_of(_config(space={"rl": {"lr": {"low": 1e-5, "high": 1e-3, "log": True}}}))
  assert s["rungs"] == [{"variant": "target", "steps": 40}]  # 0 steps: the config's rl.steps
  assert s["max_steps"] == {"target": 40}
  with pytest.raises(ValueError, match="unknown key.*'rungz'"):
    hpo.settings_of(_config(rungz=()))
  with pytest.raises(ValueError, match="names variant 'proxy'"):
    hpo.settings_of(_config(rungs=(dict(variant="proxy", steps=5),)))
  with pytest.raises(ValueError, match="must not go down"):
    hpo.settings_of(_config(rungs=(dict(steps=20), dict(steps=10))))
  with pytest.raises(ValueError, match="needs high > low"):
    hpo.settings_of(_config(space={"rl": {"lr": {"low": 1e-3, "high": 1e-5}}}))
  with pytest.raises(ValueError, match="sampler"):
    hpo.settings_of(_config(sampler="grid"))


def test_space_flattens_and_suggests_each_kind_in_its_range():
  import optuna

  space = {
    "rl": {
      "lr": {"low": 1e-5, "high": 1e-3, "log": True},
      "group_size": {"choices": (4, 8)},
      "epochs": {"low": 1, "high": 4},
      "temperature": {"low": 0.5, "high": 1.5},
    }
  }
  assert sorted(hpo.flat_space(space)) == ["rl.epochs", "rl.group_size", "rl.lr", "rl.temperature"]
  study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
  for _ in range(20):
    v = hpo.suggest(study.ask(), space)
    assert 1e-5 <= v["rl.lr"] <= 1e-3 and v["rl.group_size"] in (4, 8)
    assert isinstance(v["rl.epochs"], int) and 1 <= v["rl.epochs"] <= 4
    assert isinstance(v["rl.temperature"], float)
  assert hpo.flags({"rl.lr": 0.001, "model.preset": "nano"}) == (
    "--config.rl.lr=0.001",
    "--config.model.preset=nano",
  )


def _records(n, **series):
  return [{"step": i + 1, **{k: float(v[i]) for k, v in series.items()}} for i in range(n)]


def test_each_early_stop_rule_fires_on_the_curve_built_to_break_it_and_not_on_a_healthy_one():
  n = 30
  up = np.linspace(0.1, 0.6, n)
  healthy = _records(
    n,
    **{
      "reward/mean": up,
      "policy/entropy": np.full(n, 0.5),
      "gen/len_mean": np.full(n, 6.0),
      "train/grad_norm": np.full(n, 1.0),
      "kl/mean": np.full(n, 0.01),
      "train/nonfinite": np.zeros(n),
    },
  )
  rules = {name: {} for name in early_stop.RULES}
  assert early_stop.check(healthy, rules) is None
  broken = {
    "reward_falling": ("reward/mean", up[::-1]),
    "entropy_collapsed": ("policy/entropy", np.r_[np.full(n - 1, 0.5), 0.01]),
    "length_blowup": ("gen/len_mean", np.r_[np.full(n - 1, 6.0), 30.0]),
    "grad_spike": ("train/grad_norm", np.r_[np.full(n - 1, 1.0), 1e4]),
    "kl_spike": ("kl/mean", np.r_[np.full(n - 1, 0.01), 5.0]),
    "nonfinite": ("train/nonfinite", np.r_[np.zeros(n - 1), 1.0]),
  }
  for name, (key, values) in broken.items():
    curve = [dict(r, **{key: float(v)}) for r, v in zip(healthy, values)]
    reason = early_stop.check(curve, rules)
    assert reason is not None and reason.startswith(name + ":"), (name, reason)
    assert early_stop.check(curve, {k: {} for k in rules if k != name}) is None, name
  # warm-up: a falling reward over the first steps is not a stop
  assert early_stop.reward_falling(_records(8, **{"reward/mean": up[:8][::-1]})) is None
  with pytest.raises(ValueError, match="unknown early-stop rule 'slope'"):
    early_stop.check(healthy, {"slope": {}})
  with pytest.raises(ValueError, match="reward_falling"):
    early_stop.check(healthy, {"reward_falling": {"windw": 3}})


def test_the_budget_is_never_passed_once_a_variant_has_a_measured_rate(tmp_path, monkeypatch):
  """Rungs cost 1 CPU-second a step: the study stops before a rung that would pass 100 s."""

  def fake_rung(study, number, params, rung):
    start = {20: 0, 60: 20}[rung["steps"]]
    value = -((np.log10(params["rl.lr"]) + 3.5) ** 2) + 0.01 * rung["steps"]
    return {"value": value, "cpu_s": float(rung["steps"] - start), "stop": None, **rung}

  monkeypatch.setattr(hpo, "run_rung", fake_rung)
  settings = hpo.settings_of(
    _config(
      space={"rl": {"lr": {"low": 1e-5, "high": 1e-2, "log": True}}},
      rungs=(dict(steps=20), dict(steps=60)),
      budget_s=145.0,
      prune=False,
      shared=(),
    )
  )
  study = hpo.Study(
    QUICKSTART, "", settings, str(tmp_path), runner.LocalBackend(0), echo=lambda _: None
  )
  summary = hpo.run_study(study)
  # 60 s a trial: two whole trials (120 s), then a third's first rung (140 s) and not its
  # second (it would end at 180 s)
  assert summary["cpu_s"] == 140.0 and summary["trials_complete"] == 2
  assert summary["cpu_s"] <= settings["budget_s"]
  assert os.path.exists(tmp_path / "trials.md") and os.path.exists(tmp_path / "history.png")
  # rerunning the finished study runs nothing more
  assert hpo.run_study(study)["cpu_s"] == 140.0


def _study_cmd(out):
  return [
    sys.executable,
    os.path.join(REPO, "scripts", "hpo.py"),
    QUICKSTART,
    "--arg",
    "smoke",
    "--trials",
    "2",
    "--out",
    str(out),
  ]


def _trials(out):
  import optuna

  study = optuna.load_study(study_name="hpo", storage=f"sqlite:///{out}/study.db")
  return [
    (t.number, t.state.name, t.params, [r["value"] for r in t.user_attrs["rungs"]])
    for t in study.get_trials()
  ]


@pytest.mark.slow
def test_a_study_killed_with_sigkill_resumes_to_the_same_trials(tmp_path):
  full, cut = tmp_path / "full", tmp_path / "cut"
  subprocess.run(_study_cmd(full), check=True, capture_output=True, cwd=REPO)
  proc = subprocess.Popen(
    _study_cmd(cut), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO
  )
  marker = cut / "trials" / "0000" / "target" / "rung2.json"  # trial 0 between its rungs
  deadline = time.time() + 300
  while not marker.exists() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert marker.exists()
  assert not (cut / "summary.json").exists()
  subprocess.run(_study_cmd(cut), check=True, capture_output=True, cwd=REPO)
  a, b = _trials(full), _trials(cut)
  assert [t[:3] for t in a] == [t[:3] for t in b]
  assert len(a) == 2 and all(len(t[3]) == 2 for t in a)
  np.testing.assert_allclose([t[3] for t in a], [t[3] for t in b], atol=1e-6)
  with open(cut / "summary.json") as f:
    assert json.load(f)["trials"] == 2
