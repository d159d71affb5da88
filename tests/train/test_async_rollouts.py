"""Asynchronous rollouts: the producer's queue bound, staleness bound, errors and shutdown
(with a fake generator), and the RL loop with config.rl.async_rollouts."""

import threading
import time
from typing import NamedTuple

import pytest
import rl_fixtures as fx

from posttrain_jax.methods import validate
from posttrain_jax.train import async_rollouts as async_lib
from posttrain_jax.train.validate import ConfigError


class _Batch(NamedTuple):
  version: int
  n: int


def _producer(delay=0.0, **kwargs):
  calls = []

  def generate(params, version, n):
    calls.append((params, version, n))
    time.sleep(delay)
    return _Batch(version, n)

  return async_lib.RolloutProducer(generate, **kwargs), calls


def test_queue_is_bounded_and_batches_arrive_in_order():
  producer, calls = _producer(queue_size=2, max_staleness=100)
  with producer:
    producer.publish("p0", 0)
    producer.start()
    time.sleep(0.3)  # a trainer that is slow to take: the producer must stop 3 batches ahead
    assert len(calls) <= 3 and producer.max_queued <= 2
    got = [producer.get(0)[0].n for _ in range(5)]
  assert got == [0, 1, 2, 3, 4]


def test_batches_use_the_newest_published_parameters_and_stale_ones_are_dropped():
  producer, calls = _producer(delay=0.01, queue_size=1, max_staleness=1)
  with producer:
    producer.publish("p0", 0)
    producer.start()
    batch, m = producer.get(0)
    assert batch.version == 0 and m["async/staleness"] == 0
    producer.publish("p5", 5)  # the trainer jumped ahead: queued version-0 batches are too old
    batch, m = producer.get(5)
    assert batch.version == 5 and m["async/staleness"] == 0
    assert m["async/dropped"] >= 1 and producer.dropped == m["async/dropped"]
    for v in range(6, 12):  # a trainer one version ahead of every publish
      batch, m = producer.get(v)
      assert v - batch.version <= 1
      producer.publish(f"p{v}", v)
  versions = [c[1] for c in calls]  # each batch used the newest parameters at its start
  assert versions == sorted(versions) and all(p == f"p{v}" for p, v, _ in calls)


def test_producer_error_reaches_the_trainer():
  def broken(params, version, n):
    raise KeyError("verifier exploded")

  producer = async_lib.RolloutProducer(broken, queue_size=1, max_staleness=1)
  with producer:
    producer.publish("p", 0)
    producer.start()
    with pytest.raises(async_lib.ProducerError, match="verifier exploded") as info:
      producer.get(0, timeout=10)
  assert isinstance(info.value.__cause__, KeyError)


def test_stop_returns_while_the_producer_is_blocked_on_a_full_queue():
  producer, _ = _producer(queue_size=1, max_staleness=1)
  producer.publish("p", 0)
  producer.start()
  time.sleep(0.1)  # queue full, producer blocked on put
  t = time.perf_counter()
  producer.stop()
  assert time.perf_counter() - t < 5
  assert not any(th.name == "rollout-producer" and th.is_alive() for th in threading.enumerate())


def test_get_times_out_with_a_clear_error():
  producer, _ = _producer()
  with pytest.raises(TimeoutError, match="no rollout batch"):
    producer.get(0, timeout=0.2)  # never started: nothing arrives


def _async_config(steps, **rl):
  c = fx.smoke_config(steps)
  c.rl.async_rollouts.update(enabled=True, queue_size=1, max_staleness=1)
  c.rl.update(**rl)
  return c


@pytest.mark.parametrize(
  "loss", [dict(policy_loss="ppo_clip", is_correction="tis"), dict(policy_loss="asympo")]
)
def test_rl_loop_trains_on_bounded_staleness(tmp_path, coin_env, loss):
  out = fx.run(tmp_path, _async_config(6, **loss))
  for r in out:
    assert 0 <= r["async/staleness"] <= 1
    # the trainer was at version step-1; the batch's rollouts were sampled at weight_version
    assert r["sampler/weight_version"] == r["step"] - 1 - r["async/staleness"]
    assert r["rollouts/generated"] == 16
  assert out[-1]["async/max_queued"] <= 1
  # Resuming an async run restarts the producer from the checkpoint's parameters.
  fx.resumed_run(tmp_path / "cut", lambda n: _async_config(n, **loss), 2, 4)


def test_async_config_errors():
  c = _async_config(2)
  c.rl.staleness = 1
  with pytest.raises(ConfigError, match="staleness=0"):
    validate(c)
  c = fx.smoke_config(2, "cero")
  c.rl.async_rollouts.enabled = True
  with pytest.raises(ConfigError, match="scheduler 'cero'"):
    validate(c)
  c = _async_config(2)
  c.rl.async_rollouts.queue_size = 0
  with pytest.raises(ConfigError, match="async_rollouts.queue_size must be a positive integer"):
    validate(c)
