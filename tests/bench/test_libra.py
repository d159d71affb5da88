"""The Libra simulator (bench/libra_sim.py; methods_A.md section 11 (d)): conservation, the split's
worker counts, monotone demotion, one bucket reproducing an independent FIFO simulation, the
planner's fit, and the experiment's wiring."""

import dataclasses
import math

import numpy as np
import pytest

from posttrain_jax.bench import libra_sim as libra

W = libra.Workload(rows=24, steps=4)
C = libra.Cluster(gpus=8, slots=4)
CMLFQ = libra.Policy(
  tp=(1, 2, 4), gpu_share=(0.5, 0.25, 0.25), quantum=(40, 160, math.inf), rollout_gpus=7
)


def _requests(seed=0, step=0):
  return libra.trajectories(np.random.default_rng(seed), W, step)


@pytest.mark.parametrize("policy", [libra.FIFO, CMLFQ], ids=["fifo", "cmlfq"])
def test_every_request_finishes_once_with_all_its_tokens(policy):
  requests = _requests()
  out = libra.rollout(C, policy, 7, requests)
  assert sorted(out["finish"]) == [r["id"] for r in requests]
  assert out["tokens"] == sum(sum(r["tokens"]) for r in requests)
  # A request cannot finish before its own tokens and tool calls could have run.
  fastest = libra.step_time(C, max(policy.tp), 1)
  for r in requests:
    assert out["finish"][r["id"]] >= sum(r["tools"]) + sum(r["tokens"]) * fastest - 1e-9
  assert out["makespan"] == max(out["finish"].values())


def test_demotion_is_monotone_and_follows_tool_returns():
  requests = _requests(1)
  out = libra.rollout(C, CMLFQ, 7, requests)
  L = len(CMLFQ.tp)
  for r in requests:
    h = out["history"][r["id"]]
    assert h[0] == 0 and all(b - a == 1 for a, b in zip(h, h[1:])) and h[-1] <= L - 1
    # at least one demotion per tool return, until the last bucket
    assert len(h) - 1 >= min(len(r["tools"]), L - 1)


def _reference_fifo(cluster, gpus, requests):
  """An independent FIFO continuous-batching simulation: degree-1 engines, one queue in order
  of (re)arrival, rows given a slot during a step join at the next one."""
  queue = [r["id"] for r in requests]
  back = []  # (time, id): tool returns pending
  turn = {r["id"]: 0 for r in requests}
  left = {r["id"]: r["tokens"][0] for r in requests}
  by_id = {r["id"]: r for r in requests}
  rows = [[] for _ in range(gpus)]
  waiting = [[] for _ in range(gpus)]
  end = [None] * gpus  # current step's end time, None: idle
  finish, now = {}, 0.0

  def give():
    for e in range(gpus):
      while queue and len(rows[e]) + len(waiting[e]) < cluster.slots:
        waiting[e].append(queue.pop(0))
      if end[e] is None and (rows[e] or waiting[e]):
        rows[e] += waiting[e]
        waiting[e] = []
        end[e] = now + libra.step_time(cluster, 1, len(rows[e]))

  give()
  while len(finish) < len(requests):
    times = [(t, 0, e) for e, t in enumerate(end) if t is not None]
    times += [(t, 1, i) for i, (t, _) in enumerate(back)]
    t, kind, index = min(times)
    now = t
    if kind == 1:
      queue.append(back.pop(index)[1])
    else:
      e = index
      for rid in list(rows[e]):
        left[rid] -= 1
        if left[rid] == 0:
          rows[e].remove(rid)
          r = by_id[rid]
          if turn[rid] == len(r["tokens"]) - 1:
            finish[rid] = now
          else:
            back.append((now + r["tools"][turn[rid]], rid))
            turn[rid] += 1
            left[rid] = r["tokens"][turn[rid]]
      rows[e] += waiting[e]
      waiting[e] = []
      end[e] = now + libra.step_time(cluster, 1, len(rows[e])) if rows[e] else None
    give()
  return max(finish.values())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_bucket_on_a_static_split_reproduces_the_fifo_baseline(seed):
  requests = _requests(seed)
  out = libra.rollout(C, libra.FIFO, 4, requests)
  assert out["makespan"] == pytest.approx(_reference_fifo(C, 4, requests), rel=1e-12)


def test_the_split_keeps_every_gpu_and_one_engine_per_bucket():
  W8 = libra.Workload(rows=24, steps=10)
  out = libra.run(W8, C, dataclasses.replace(CMLFQ, adaptive=True), 0)
  assert all(sum(CMLFQ.tp) <= w <= C.gpus - 1 for w in out["splits"])
  assert all(abs(a - b) <= CMLFQ.max_move + 1 for a, b in zip(out["splits"], out["splits"][1:]))
  static = libra.run(W8, C, CMLFQ, 0)
  assert set(static["splits"]) == {CMLFQ.rollout_gpus}
  engines = libra.engines(CMLFQ, 7)
  assert sum(tp for _, tp in engines) <= 7 and {b for b, _ in engines} == {0, 1, 2}
  with pytest.raises(ValueError, match="one engine per bucket"):
    libra.engines(CMLFQ, 6)


def test_fit_and_best_split():
  x, y = libra.fit_time([(2, 10 / 2 + 3), (4, 10 / 4 + 3), (8, 10 / 8 + 3)])
  assert x == pytest.approx(10) and y == pytest.approx(3)
  x, y = libra.fit_time([(4, 5.0)])
  assert (x, y) == (20.0, 0.0)
  # Rollout 12/W_r, training 4/W_t on 8 GPUs: 6 rollout GPUs balance them (2 vs 2).
  assert libra.best_split((12.0, 0.0), (4.0, 0.0), 8) == 6
  # A rollout that more GPUs cannot shorten: give training all but the minimum.
  assert libra.best_split((0.0, 5.0), (8.0, 0.0), 8, lo=2) == 2
  assert libra.best_split((12.0, 0.0), (4.0, 0.0), 8, current=2, max_move=2) == 4


def test_the_experiment_wiring():
  import importlib.util
  import os

  path = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "libra.py")
  spec = importlib.util.spec_from_file_location("libra_experiment", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  small = libra.Workload(rows=16, steps=3)
  a = module.run_arm("cmlfq_adaptive", 0, small)
  b = module.run_arm("cmlfq_adaptive_no_tp", 0, small)
  assert set(module.METRICS) <= set(a) and a["arm"] == "cmlfq_adaptive"
  assert a["rollout_s"] < b["rollout_s"]  # the control's engines are no faster per token
  assert module.run_arm("fifo_static", 0, small) == module.run_arm("fifo_static", 0, small)


def test_the_script_checks_a_recorded_seed(tmp_path):
  # scripts/libra.py --check reruns seed 0 of the table it wrote: the simulation is a function
  # of its seed, so the rerun is identical and the table says so under its verdict.
  import json
  import os
  import runpy

  script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "libra.py")
  main = runpy.run_path(script, run_name="libra_script")["main"]
  assert main(["--seeds", "2", "--out", str(tmp_path)]) == 0
  records = [json.loads(l) for l in (tmp_path / "runs.jsonl").read_text().splitlines()]
  assert main(["--check", "--out", str(tmp_path)]) == 0
  result = json.loads((tmp_path / "rerun.json").read_text())
  assert result["identical"] and result["seeds"] == [0]
  assert len(result["rows"]) >= len({r["arm"] for r in records})
  env = [json.loads(l) for l in (tmp_path / "environment.jsonl").read_text().splitlines()]
  assert env[0]["recorded"] and env[0]["jobs_run"] == len(records)
  assert "identical to the recorded runs" in (tmp_path / "table.md").read_text()
