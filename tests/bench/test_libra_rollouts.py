"""bench/libra_rollouts.py: the real-rollout Libra benchmark's workload and measurement, and
experiments/libra_rollouts.py's wiring (tiny settings)."""

import importlib.util
import os

import jax
import numpy as np

from posttrain_jax.bench import libra_rollouts as lr

SMALL = lr.Workload(
  episodes=8, vocab_size=12, obs_tokens=3, prompt_tokens=(3, 6), budget=64, preset="nano"
)


def test_turn_counts_are_long_tailed_as_drawn():
  w = lr.Workload(episodes=4000)
  _, mask, calls = lr.episodes(w, 0)
  # 1 + floor(LogNormal(0, 1)): one call when the draw is below 1 (half the time), ten or
  # more when above 9 (P = 1 - Phi(ln 9) = 0.0142), capped at 12.
  assert abs(np.mean(calls == 1) - 0.5) < 3 * np.sqrt(0.25 / 4000)
  assert abs(np.mean(calls >= 10) - 0.0142) < 3 * np.sqrt(0.0142 / 4000)
  assert calls.max() == 12 and calls.min() == 1
  lengths = mask.sum(axis=1)
  assert lengths.min() == 8 and lengths.max() == 24
  np.testing.assert_array_equal(lr.episodes(w, 0)[2], calls)  # a seed is a workload
  assert not np.array_equal(lr.episodes(w, 1)[2], calls)


def test_every_schedule_plays_the_drawn_workload():
  """Each episode that ends inside its budget made exactly its drawn calls, under FIFO and
  under the buckets; the one-batch FIFO decodes its longest episode's length."""
  model = lr.policy(SMALL)
  tokens, mask, calls = lr.episodes(SMALL, 3)
  for levels in (((8, 64, 0),), ((4, 8, 1), (4, 16, 0))):
    sched = lr.scheduler(SMALL, model[0], levels)
    ro = sched(model[1], tokens, mask, jax.random.key(0), respond=lr.Host(SMALL, calls))
    env, own = np.asarray(ro.env_mask), np.asarray(ro.completion_mask)
    starts = (env > 0) & ~np.pad(env > 0, ((0, 0), (1, 0)))[:, :-1]
    done = ~np.asarray(ro.truncated)
    assert done.sum() >= 6
    np.testing.assert_array_equal(starts.sum(1)[done], calls[done])
    if len(levels) == 1:
      longest = int(((own + env) > 0).sum(axis=1).max())
      assert sched.last_stats.decode_steps == longest
      assert sched.last_stats.row_steps == 8 * longest
    else:
      assert sched.last_stats.batches > 2
  record = lr.measure(SMALL, ((4, 8, 1), (4, 16, 0)), 3, model)
  assert record["calls_ok"] == 1.0
  assert record["throughput"] >= record["raw_throughput"]


def test_the_experiment_wiring():
  path = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "libra_rollouts.py")
  spec = importlib.util.spec_from_file_location("libra_rollouts_experiment", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  records = module.run_seed(0, SMALL)
  assert [r["arm"] for r in records] == list(module.ARMS)
  by_arm = {r["arm"]: r for r in records}
  assert all(r["calls_ok"] == 1.0 for r in records)
  assert by_arm["fifo_64"]["batches"] == 1 and by_arm["fifo_8"]["batches"] == 1
  assert by_arm["cmlfq"]["batches"] > by_arm["fifo_8"]["batches"]
  assert module.sweep().baseline == "fifo_8"


def test_the_continuous_experiment_wiring():
  path = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "libra_continuous.py")
  spec = importlib.util.spec_from_file_location("libra_continuous_experiment", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  records = module.run_seed(1, SMALL)
  by_arm = {r["arm"]: r for r in records}
  assert list(by_arm) == list(module.ARMS)
  assert all(r["calls_ok"] == 1.0 for r in records)
  # Demoted after the first call: the C-MLFQ arm continues episodes in further batches.
  assert by_arm["cmlfq_continuous"]["batches"] > by_arm["fifo_continuous"]["batches"]
  assert module.sweep().baseline == "fifo_continuous"
