"""envs.diagnostics and scripts/env_diagnostics.py: the substrate analysis of the suite."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import pytest

from posttrain_jax import envs
from posttrain_jax.envs import diagnostics as diag
from posttrain_jax.envs import suite

TASKS = {n: e for n, e in envs.ENVS.items() if n.startswith(suite.PREFIX)}


def test_base_envs_excludes_mixtures():
  names = set(diag.base_envs(envs.ENVS))
  mixtures = {n for n, e in envs.ENVS.items() if hasattr(e, "envs")}
  assert mixtures and "tron" in mixtures  # the suite's mixture exists and is left out
  assert names == set(envs.ENVS) - mixtures
  assert {"arithmetic", "countdown", "digit_sum", "grammar", *TASKS} <= names


@pytest.mark.parametrize("name", sorted(TASKS))
def test_suite_is_reliable_and_self_consistent(name):
  env = TASKS[name]
  for level, stats in diag.generation_reliability(env, seeds=range(2), n=10).items():
    assert stats["reliability"] == 1.0 and stats["call_failures"] == 0, (level, stats)
  for level in (env.levels[0], env.levels[-1]):
    c = diag.verifier_consistency(env, level, n=40)
    assert (c["own"], c["perturbed"], c["malformed"], c["raised"]) == (1.0, 0.0, 0.0, 0)


class _Broken(suite.Reverse):
  """Raises for some keys and hands out a wrong answer for some instances."""

  short = "broken"

  def sample(self, key, n, *, level, split="train"):
    if int(jax.random.randint(key, (), 0, 4)) == 0:
      raise RuntimeError("generator crashed")
    problems = super().sample(key, n, level=level, split=split)
    return [dataclasses.replace(p, answer="zz") if p.prompt[1] == "a" else p for p in problems]


def test_reliability_flags_a_broken_generator():
  stats = diag.generation_reliability(_Broken(), seeds=range(8), n=20, levels=[3])[3]
  assert stats["call_failures"] > 0 and stats["invalid"] > 0
  assert 0 < stats["reliability"] < 1
  assert stats["errors"] and len(stats["errors"]) <= 5


def test_near_duplicates_flag_an_injected_copy():
  sample = lambda name, k: [
    p.prompt
    for lvl in envs.ENVS[name].levels
    for p in envs.ENVS[name].sample(jax.random.key(k), 30, level=lvl)
  ]
  prompts = {
    n: sample(n, i)
    for i, n in enumerate(["tron/reverse", "tron/distinct", "tron/sort", "tron/parity"])
  }
  assert diag.near_duplicates(prompts) == {}
  copied = dict(prompts, **{"tron/copy": prompts["tron/sort"][::3]})
  retagged = dict(prompts, **{"tron/retag": ["W" + p[1:] for p in prompts["tron/distinct"]]})
  dup = diag.near_duplicates(copied)
  assert set(dup) == {"tron/copy|tron/sort"}
  assert dup["tron/copy|tron/sort"]["exact"] == len(set(prompts["tron/sort"][::3]))
  near = diag.near_duplicates(retagged, threshold=0.6)
  assert set(near) == {"tron/distinct|tron/retag"}
  entry = near["tron/distinct|tron/retag"]
  assert entry["exact"] == 0 and entry["near"] > 0
  assert all(d <= 0.2 for _, _, _, d in entry["examples"])


def test_edit_distance_and_perturb():
  assert diag.edit_distance("kitten", "sitting") == 3 and diag.edit_distance("", "ab") == 2
  assert diag.perturb("12", "0123456789") == ["122", "13"]
  assert diag.perturb("a b", "ab ") == ["a bb", "a a"]


def test_diversity_grows_with_level():
  env = TASKS["tron/reverse"]
  low = diag.instance_diversity(env, 1, n=300)
  high = diag.instance_diversity(env, 7, n=300)
  assert low["distinct_prompts"] < 64 <= high["distinct_prompts"] == 300
  assert high["pair_ratio"] == 1.0


def test_pass_rate_falls_with_level_for_a_noisy_oracle():
  sets = diag.problem_sets(TASKS, n=300, split="train")
  oracle = diag.noisy_oracle(sets, error_per_char=0.05)
  rates = diag.pass_rate_by_level(sets, oracle, TASKS)
  assert diag.falls_with_level(rates, tol=0.1) == {n: [] for n in TASKS}
  for name, by_level in rates.items():
    levels = sorted(by_level)
    assert by_level[levels[0]] > by_level[levels[-1]] + 0.1, (name, by_level)
  perfect = diag.pass_rate_by_level(
    sets, lambda ps: [p for p in map(_answers(sets).get, ps)], TASKS
  )
  assert all(r == 1.0 for by_level in perfect.values() for r in by_level.values())
  rising = {"x": {1: 0.2, 2: 0.5, 3: 0.45, 4: 0.3}, "y": {2: 0.9, 1: 0.95}}
  assert diag.falls_with_level(rising, tol=0.1) == {"x": [(1, 2)], "y": []}
  assert diag.falls_with_level(rising) == {"x": [(1, 2)], "y": []}
  with pytest.raises(ValueError, match="completions"):
    diag.pass_rate_by_level(sets, lambda ps: ps[:1], TASKS)


def _answers(sets):
  return {p.prompt: p.answer for by_level in sets.values() for ps in by_level.values() for p in ps}


def test_run_and_report_and_cli(tmp_path):
  chosen = {n: TASKS[n] for n in ("tron/sub", "tron/bool")}
  chosen["tron/copy"] = suite.Bool()
  chosen["tron/copy"].short = "copy"  # same generator under another name: must be flagged
  result = diag.run(
    chosen, seeds=range(2), n=5, diversity_n=50, dup_per_level=20, consistency_n=20, pass_n=20
  )
  assert "tron/bool|tron/copy" in result["near_duplicates"]
  report = diag.report_markdown(result)
  for heading in (
    "Generation reliability",
    "Instance diversity",
    "near-duplicates",
    "Pass rate by level",
  ):
    assert heading in report
  assert "tron/bool|tron/copy" in report
  out, raw = tmp_path / "diag.md", tmp_path / "diag.json"
  repo = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(repo, "scripts", "env_diagnostics.py"),
      "--envs=tron/sub,tron/parity",
      "--seeds=1",
      "--n=5",
      "--diversity-n=50",
      "--dup-per-level=10",
      "--consistency-n=10",
      "--pass-n=10",
      f"--out={out}",
      f"--json={raw}",
    ],
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "Pass rate by level" in out.read_text()
  assert set(json.loads(raw.read_text())["envs"]) == {"tron/sub", "tron/parity"}
