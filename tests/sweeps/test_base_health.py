"""The base-health gate (sweeps/reproduce.healthy_seeds, report.gate_line): a seed whose shared
start is below the declared floor is replaced by the next unused seed, and the table says so."""

import math

import ml_collections
import pytest

from posttrain_jax.sweeps import report
from posttrain_jax.sweeps.reproduce import healthy_seeds
from posttrain_jax.train import configs

GATE = ml_collections.ConfigDict(dict(metric="accuracy_before_rl", floor=0.05))


def _gate(values: dict, seeds: int, smoke: bool = False):
  ran = []

  def run_bases(candidates):
    ran.append(list(candidates))
    return []

  out = healthy_seeds(run_bases, lambda s: values[s], seeds, GATE, smoke)
  return ran, out


def test_dead_bases_are_replaced_by_the_next_unused_seeds_in_rounds():
  values = {0: 0.52, 1: 0.015, 2: 0.004, 3: 0.40, 4: 0.03, 5: 0.61}
  ran, (failed, healthy, bases) = _gate(values, 3)
  # seeds 1 and 2 are dead -> 3 and 4 run; 4 is dead too -> 5 runs; 3 replacements in all
  assert ran == [[0, 1, 2], [3, 4], [5]]
  assert healthy == [0, 3, 5] and failed == []
  assert [b["seed"] for b in bases if not b["healthy"]] == [1, 2, 4]
  line = report.gate_line(GATE, bases)
  assert "accuracy_before_rl >= 0.05; 6 seeds checked, 3 below the floor" in line
  assert "replaced by the next unused seed: seed 1 (0.015), seed 2 (0.004), seed 4 (0.030)." in line


def test_at_most_as_many_replacements_as_seeds():
  values = {0: 0.01, 1: 0.0, 2: 0.0, 3: 0.0}
  ran, (_, healthy, bases) = _gate(values, 2)
  assert ran == [[0, 1], [2, 3]] and healthy == [] and len(bases) == 4


def test_a_base_that_failed_is_left_out_and_not_replaced():
  """A crash is an error to report (reproduce raises on failed jobs), not a dead base: no
  further seeds are spent on it."""
  ran, (_, healthy, bases) = _gate({0: 0.5, 1: math.nan, 2: 0.4}, 3)
  assert ran == [[0, 1, 2]] and healthy == [0, 2]
  assert [b["healthy"] for b in bases] == [True, False, True]
  line = report.gate_line(GATE, bases)
  assert line.endswith(
    "3 seeds checked, 0 below the floor; the base of seed 1 failed and is left out."
  )


def test_smoke_runs_record_the_gate_and_replace_nothing():
  ran, (_, healthy, bases) = _gate({0: 0.0}, 1, smoke=True)
  assert ran == [[0]] and healthy == [0]
  line = report.gate_line(GATE, bases)
  assert line.endswith("1 below the floor, kept (a smoke run replaces nothing): seed 0 (0.000).")


def test_no_gate_is_stated_and_a_malformed_gate_is_refused():
  assert report.gate_line(None, []).startswith("Base-health gate: none declared")
  claim = dict(text="t", arm="a", metric="m", direction="higher")
  with pytest.raises(ValueError, match="base_health must be dict"):
    configs.sweep(
      title="t",
      arms=("a", "b"),
      baseline="b",
      claim=claim,
      metrics=("m",),
      base_health=dict(metric="m"),
    )
  s = configs.sweep(
    title="t",
    arms=("a", "b"),
    baseline="b",
    claim=claim,
    metrics=("m",),
    base_health=dict(metric="m", floor=0.1),
  )
  assert s.base_health.floor == 0.1


def test_a_gate_declared_after_the_runs_is_checked_on_their_recorded_starts():
  from posttrain_jax.sweeps.reproduce import gate_from_runs

  records = [
    {"arm": arm, "seed": seed, "accuracy_before_rl": v}
    for seed, v in ((1, 0.02), (0, 0.40))
    for arm in ("base", "method")
  ]
  bases = gate_from_runs(records, GATE, "base")
  assert [(b["seed"], b["value"], b["healthy"]) for b in bases] == [
    (0, 0.4, True),
    (1, 0.02, False),
  ]
  line = report.gate_line(GATE, bases)
  assert line.startswith("Base-health gate (declared after the runs, checked on their recorded")
  assert line.endswith("1 below the floor, kept (a rerun would replace them): seed 1 (0.020).")
