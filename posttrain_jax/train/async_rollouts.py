"""Asynchronous rollouts on one host: a producer thread generates while the trainer updates.

``config.rl.async_rollouts`` (enabled, queue_size, max_staleness). The producer loops: take the
newest parameters the trainer published (a copy, so the trainer's donated buffers are never
read), generate and score one batch with them (``batch.generate``; every rollout carries
``policy_version``, the trainer step that produced those parameters), put it in a queue of at
most ``queue_size`` batches (it blocks while the queue is full, so it runs at most
``queue_size + 1`` batches ahead). The trainer takes batches in order; a batch whose version is
more than ``max_staleness`` steps behind the trainer's is dropped (counted) and the next one is
taken, so every update trains on rollouts at most ``max_staleness`` versions old. The
behaviour-corrected losses read the rollouts' own behaviour log-probs (``old_logprobs =
'behaviour'``, ``is_correction``, ASymPO / SPO), exactly as with the synchronous ``staleness``.

JAX dispatch is thread-safe; the two threads share the devices (on a CPU the two XLA programs
share its cores). A batch's randomness comes from ``fold_in(key, n)`` of its sequence number
``n``, but which parameter version generates it depends on timing, so an async run is not
bitwise reproducible and a resumed run restarts the producer from the checkpoint's parameters
(queued batches are not checkpointed; they are regenerated).
"""

import queue
import threading
import time
from collections.abc import Callable

from posttrain_jax.registry import ConfigError, TrainingError


class ProducerError(RuntimeError):
  """The rollout producer thread raised; the original exception is the ``__cause__``."""


class RolloutProducer:
  """A background thread running ``generate_fn(params, version, n) -> batch`` (``batch`` has a
  ``version`` attribute) on the newest published parameters, into a bounded queue."""

  def __init__(self, generate_fn: Callable, *, queue_size: int = 1, max_staleness: int = 1):
    if queue_size < 1 or max_staleness < 0:
      raise ValueError(
        f"need queue_size >= 1 and max_staleness >= 0, got {queue_size}, {max_staleness}"
      )
    self._generate = generate_fn
    self.queue_size, self.max_staleness = int(queue_size), int(max_staleness)
    self._queue = queue.Queue(maxsize=self.queue_size)
    self._latest = None  # (params, version)
    self._cond = threading.Condition()
    self._stop = threading.Event()
    self._error = None
    self._thread = None
    self.produced = 0
    self.dropped = 0
    self.max_queued = 0

  # -- trainer side ------------------------------------------------------------------------
  def publish(self, params, version: int) -> None:
    """Makes ``params`` (a copy the trainer will not donate) the ones the next batch uses."""
    with self._cond:
      self._latest = (params, int(version))
      self._cond.notify_all()

  def start(self) -> "RolloutProducer":
    if self._thread is not None:
      raise RuntimeError("producer already started")
    self._thread = threading.Thread(target=self._loop, name="rollout-producer", daemon=True)
    self._thread.start()
    return self

  def get(self, version: int, timeout: float = 3600.0) -> tuple:
    """The next batch at most ``max_staleness`` versions behind ``version`` (older ones are
    dropped), and ``{'async/...': float}`` metrics: its staleness, the seconds the trainer
    waited, the queue length it found, batches dropped so far."""
    t0 = time.perf_counter()
    found = self._queue.qsize()
    deadline = t0 + timeout
    while True:
      self._raise_if_failed()
      try:
        batch = self._queue.get(timeout=0.05)
      except queue.Empty:
        if time.perf_counter() > deadline:
          raise TimeoutError(f"no rollout batch from the producer within {timeout:.0f} s")
        continue
      staleness = int(version) - int(batch.version)
      if staleness > self.max_staleness:
        self.dropped += 1
        continue
      return batch, {
        "async/staleness": float(staleness),
        "async/wait_s": time.perf_counter() - t0,
        "async/queued": float(found),
        "async/dropped": float(self.dropped),
        "async/max_queued": float(self.max_queued),
      }

  def stop(self, timeout: float = 60.0) -> None:
    """Stops the thread (it finishes the batch in flight) and drops queued batches."""
    self._stop.set()
    with self._cond:
      self._cond.notify_all()
    if self._thread is not None:
      while self._thread.is_alive():
        try:  # unblock a producer waiting on a full queue
          while True:
            self._queue.get_nowait()
        except queue.Empty:
          pass
        self._thread.join(timeout=0.05)
        timeout -= 0.05
        if timeout <= 0:
          break
    self._thread = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.stop()

  # -- producer side -----------------------------------------------------------------------
  def _raise_if_failed(self) -> None:
    if isinstance(self._error, (ConfigError, TrainingError)):
      raise self._error  # the library's own one-line errors (e.g. the reward error-rate stop)
    if self._error is not None:
      raise ProducerError(
        f"the rollout producer failed: {type(self._error).__name__}: {self._error}"
      ) from self._error

  def _loop(self) -> None:
    try:
      while not self._stop.is_set():
        with self._cond:
          while self._latest is None and not self._stop.is_set():
            self._cond.wait(timeout=0.1)
          if self._stop.is_set():
            return
          params, version = self._latest
        batch = self._generate(params, version, self.produced)
        self.produced += 1
        while not self._stop.is_set():
          try:
            self._queue.put(batch, timeout=0.05)
            self.max_queued = max(self.max_queued, self._queue.qsize())
            break
          except queue.Full:
            continue
    except BaseException as e:  # pylint: disable=broad-except  (re-raised in the trainer)
      self._error = e
