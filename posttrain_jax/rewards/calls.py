"""Reward calls that cannot hang or crash a run: worker processes, a per-call timeout, outcomes.

:class:`Scorer` scores a batch of completions with ``verifier.verify(problem, completion)``
(or ``verifier(problem, completion)`` for a plain reward function):

- ``workers > 0`` (default): the calls run in a pool of worker processes (multiprocessing's
  ``forkserver`` context, safe beside JAX's threads in this process), started on the first
  call and reused by every later batch and run of this process. A batch is cut into one task
  per worker; the verifier (the env or dataset) is pickled once and kept by each worker. Each
  call gets ``timeout`` seconds by an alarm inside the worker (``signal.setitimer``); a worker
  that still gives no answer ``GRACE`` seconds later (a call stuck in C code, or one that
  catches the alarm) is killed, its call counted as a timeout, a fresh worker started and the
  rest of its task sent to a worker again. A worker that dies counts its call as ``raised``.
  Workers never run the parent's ``__main__`` and die with the run (even after kill -9). Each
  worker leads its own process group: what a timed-out call leaves running is killed after it,
  and the group is killed with the worker (on a replacement, the run's end or the run's death,
  kill -9 included).
- ``workers == 0``: the calls run in this process (for debugging); timeouts are not enforced.

Every outcome is judged by :mod:`posttrain_jax.rewards.outcomes`: failures score 0.0 and are
returned as kind codes; the first failure of each kind in a run (one Scorer) is printed as one
warning line; :meth:`Scorer.check` stops the run above ``max_error_rate``.
"""

import atexit
import collections
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
from multiprocessing import spawn
from typing import NamedTuple

import numpy as np

from posttrain_jax.registry import ConfigError, TrainingError
from posttrain_jax.rewards import outcomes

GRACE = 2.0  # seconds past the timeout before the parent kills a silent worker
LOAD_GRACE = 60.0  # seconds a worker may take to unpickle a verifier
HELD = 4  # verifiers a worker (and the parent's pickle cache) keeps


class _Timeout(BaseException):
  """Raised inside a worker by the alarm; a BaseException so ``except Exception`` in a reward
  does not swallow it."""


def _alarm(signum, frame):
  raise _Timeout()


class Raw(NamedTuple):
  """A call's unjudged result: the returned ``value``, or a failure ``code`` and ``detail``."""

  value: object
  code: int = outcomes.OK
  detail: str = ""


def call_raw(fn, problem, completion, timeout: float = 0.0) -> Raw:
  """``fn(problem, completion)``; with ``timeout`` > 0 (only in a process's main thread) an
  alarm interrupts it after ``timeout`` seconds. An exception or the timeout is a failure."""
  try:
    try:
      if timeout:
        signal.setitimer(signal.ITIMER_REAL, timeout)
      return Raw(fn(problem, completion))
    finally:
      if timeout:
        signal.setitimer(signal.ITIMER_REAL, 0)
  except _Timeout:
    return Raw(None, *outcomes.timed_out(timeout)[1:3])
  except (Exception, SystemExit) as e:  # a broken reward scores 0 and is counted; the run
    return Raw(None, *outcomes.raised(e)[1:3])  # goes on (sys.exit in a term included)


def call(verify, problem, completion, timeout: float = 0.0) -> outcomes.Outcome:
  """One reward call, judged (:func:`call_raw`, then :func:`outcomes.judge`)."""
  raw = call_raw(verify, problem, completion, timeout)
  if raw.code != outcomes.OK:
    return outcomes.Outcome(0.0, raw.code, raw.detail)
  return outcomes.judge(raw.value)


def score_row(
  verifier, problem, completion, timeout: float = 0.0, *, skip=None, progress=None
) -> outcomes.Outcome:
  """A row's outcome: ``verifier.score_row`` (several terms, each with its own timeout; ``skip``
  and ``progress`` as in ``terms.RowTerms.score_row``) when it has one, else one judged call of
  :func:`verify_of` ``(verifier)``."""
  if hasattr(verifier, "score_row"):
    return verifier.score_row(problem, completion, timeout, skip=skip, progress=progress)
  return call(verify_of(verifier), problem, completion, timeout)


def _kill_group_and_exit(signum=None, frame=None) -> None:
  """Kills every process of this worker's group (itself last): what its reward calls started."""
  os.killpg(os.getpgid(0), signal.SIGKILL)


def _die_with_parent() -> None:
  """Linux: this worker leads its own process group, and when its parent (the fork server,
  which exits with the run, kill -9 included) dies the kernel sends it SIGTERM, on which it
  kills the whole group: itself and whatever its reward calls started."""
  os.setsid()
  signal.signal(signal.SIGTERM, _kill_group_and_exit)
  try:
    import ctypes  # pylint: disable=import-outside-toplevel

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass
  if os.getppid() == 1:  # the parent died before the signal was armed
    _kill_group_and_exit()


def _group_members() -> list[int]:
  """The other processes of this worker's group (Linux /proc; [] elsewhere)."""
  group, me, out = os.getpgid(0), os.getpid(), []
  try:
    names = os.listdir("/proc")
  except OSError:
    return out
  for name in names:
    if not name.isdigit() or int(name) == me:
      continue
    try:
      with open(f"/proc/{name}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
      if int(fields[2]) == group:  # (state, ppid, pgrp, ...) after the command name
        out.append(int(name))
    except (OSError, ValueError, IndexError):
      continue
  return out


def _reap_strays() -> None:
  """Kills what a timed-out reward call left running in this worker's group (a checker's child
  that outlived the timeout) and collects the exited children. Helpers a verifier keeps across
  calls that return in time live on, until the worker stops."""
  for pid in _group_members():
    try:
      os.kill(pid, signal.SIGKILL)
    except OSError:
      pass
  while True:
    try:
      pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
      return
    if pid == 0:
      return


def _serve(conn) -> None:
  """A worker's loop: ``("score", key, blob, sys.path, items, timeout)`` -> ``("loaded",)`` when it
  unpickled a verifier, then one ``("done", outcome)`` per item; or ``("missing",)`` for a
  verifier it no longer holds, or ``("unloadable", detail)``."""
  _die_with_parent()
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
  signal.signal(signal.SIGALRM, _alarm)
  held = collections.OrderedDict()
  while True:
    try:
      _, key, blob, path, items, timeout = conn.recv()
    except (EOFError, OSError):  # the run is gone (its end of the pipe closed): so is the group
      _kill_group_and_exit()
    if blob is not None:
      sys.path[:] = path  # the parent's, as now: where the verifier's class is imported from
      try:
        held[key] = pickle.loads(blob)
      except Exception as e:  # pylint: disable=broad-except
        conn.send(("unloadable", f"{type(e).__name__}: {e}"))
        continue
      while len(held) > HELD:
        held.popitem(last=False)
      conn.send(("loaded",))
    if key not in held:
      conn.send(("missing",))
      continue
    held.move_to_end(key)
    progress = lambda i: conn.send(("term", i))
    for problem, completion, skip in items:
      row = score_row(held[key], problem, completion, timeout, skip=skip, progress=progress)
      late = outcomes.CODES["timeout"]
      if row.code == late or any(c[2] == late for c in row.components):
        _reap_strays()  # what the timed-out call started must not outlive it
      conn.send(("done", tuple(row)))


@contextlib.contextmanager
def _without_main():
  """Processes started inside do not re-run the parent's ``__main__`` (multiprocessing's spawn
  and forkserver import it in every child: a script without an ``if __name__ == "__main__"``
  guard would run again in each worker). A worker needs only this module."""
  original = spawn.get_preparation_data

  def preparation_data(name):
    data = original(name)
    data.pop("init_main_from_name", None)
    data.pop("init_main_from_path", None)
    return data

  spawn.get_preparation_data = preparation_data
  try:
    yield
  finally:
    spawn.get_preparation_data = original


def verify_of(verifier):
  """``verifier.verify`` (an env or a dataset), or ``verifier`` itself (a reward function)."""
  return getattr(verifier, "verify", verifier)


def _server_pid() -> int | None:
  """The pid of the fork server the workers are forked from (None before it starts)."""
  from multiprocessing import forkserver  # pylint: disable=import-outside-toplevel

  return forkserver._forkserver._forkserver_pid  # pylint: disable=protected-access


class _Worker:
  """One worker process, its pipe and the task it is on (``todo``: item indices not answered,
  the first being the call in progress)."""

  def __init__(self, mp):
    self.conn, child = mp.Pipe()
    self.proc = mp.Process(target=_serve, args=(child,), daemon=True, name="reward-worker")
    with _without_main():
      self.proc.start()
    child.close()
    self.held, self.todo, self.deadline, self.task = set(), [], 0.0, None
    self.term = None  # the row term the current call is in (multi-term rows report it)
    self.server = _server_pid()  # its parent: it dies with it (PR_SET_PDEATHSIG)

  def send(self, key, blob, todo, items, timeout, budget, skips) -> None:
    self.todo, self.task, self.term = list(todo), (key, todo), None
    load = key not in self.held
    self.conn.send(
      (
        "score",
        key,
        blob if load else None,
        list(sys.path) if load else None,
        [(*items[i], skips.get(i)) for i in todo],
        timeout,
      )
    )
    self.deadline = time.monotonic() + (LOAD_GRACE if key not in self.held else budget + GRACE)
    self.held.add(key)

  def stop(self) -> int | None:
    """Kills the worker with its process group (what its calls started goes with it)."""
    if self.proc.is_alive():
      try:
        os.killpg(self.proc.pid, signal.SIGKILL)
      except OSError:  # not a group leader yet (killed while starting)
        self.proc.kill()
    self.proc.join()
    self.conn.close()
    return self.proc.exitcode


class Pool:
  """Worker processes shared by every Scorer of this process (:func:`pool`)."""

  def __init__(self, size: int):
    self._mp = multiprocessing.get_context("forkserver")
    self._mp.set_forkserver_preload(["posttrain_jax.rewards.calls", "posttrain_jax.envs"])
    self._workers: list[_Worker] = []
    self._blobs = collections.OrderedDict()  # id(verifier) -> (verifier, key, blob)
    self._next_key = 0
    self._lock = threading.Lock()
    self.size = size
    self.restarts = 0  # dead idle workers replaced and fork server restarts (a term killed it)

  def _blob(self, verifier, env: str) -> tuple[int, bytes]:
    """``(key, pickled verifier)``, pickled once per verifier object."""
    entry = self._blobs.get(id(verifier))
    if entry is None or entry[0] is not verifier:
      try:
        blob = pickle.dumps(verifier)
      except Exception as e:  # pylint: disable=broad-except
        raise ConfigError(
          _unloadable(env, f"it does not pickle: {type(e).__name__}: {e}")
        ) from None
      self._next_key += 1
      entry = self._blobs[id(verifier)] = (verifier, self._next_key, blob)
      while len(self._blobs) > HELD:
        self._blobs.popitem(last=False)
    self._blobs.move_to_end(id(verifier))
    return entry[1], entry[2]

  def start(self) -> None:
    """Starts the missing workers (the first start launches the forkserver, which imports
    the envs: about 3 s, so a run calls it in the background, ahead of its first batch)."""
    with self._lock:
      self._fill()

  def _fill(self) -> None:
    while len(self._workers) < self.size:
      self._workers.append(self._new_worker())

  def run(self, verifier, problems, completions, timeout: float, env: str) -> list:
    """The outcomes of ``verifier.verify`` on every (problem, completion)."""
    with self._lock:
      key, blob = self._blob(verifier, env)
      items = list(zip(problems, completions))
      out = [None] * len(items)
      self._fill()
      for w in self._workers[self.size :]:
        w.stop()
      del self._workers[self.size :]
      tasks = collections.deque(
        t.tolist() for t in np.array_split(np.arange(len(items)), self.size) if len(t)
      )
      try:
        # A row of several terms gets each term's timeout in the worker, and their sum here.
        budget = timeout * max(1, getattr(verifier, "calls_per_row", 1))
        self._drain(tasks, key, blob, items, timeout, budget, env, out)
      except BaseException:  # e.g. Ctrl-C: a worker left mid-task would answer the next batch
        for w in [w for w in self._workers if w.todo]:
          w.stop()
          self._workers.remove(w)  # the next batch starts fresh ones
        raise
      return out

  def _drain(self, tasks, key, blob, items, timeout, budget, env, out) -> None:
    busy, skips = {}, {}  # skips: row -> {term: (code, detail)} of terms that took a worker down
    retried = set()  # (row, term) calls redone once after their worker died with its server
    while tasks or busy:
      for w in list(self._workers):
        if tasks and w.conn not in busy:
          todo = tasks.popleft()
          try:
            w.send(key, blob, todo, items, timeout, budget, skips)
          except OSError:  # it died idle, e.g. with the fork server a reward term killed
            tasks.appendleft(todo)
            self._replace(w)  # a fresh worker (a dead fork server is restarted)
            continue
          busy[w.conn] = w
      wait = max(0.0, min(w.deadline for w in busy.values()) - time.monotonic())
      for conn in multiprocessing.connection.wait(list(busy), timeout=wait):
        w = busy[conn]
        try:
          msg = conn.recv()
        except (EOFError, OSError):
          code = self._replace(w)
          if w.server != _server_pid() and (w.todo[0], w.term) not in retried:
            # Its fork server died (a term killed it) and took every busy worker with it:
            # the call is redone once before its term is blamed.
            retried.add((w.todo[0], w.term))
            self._requeue(tasks, w.todo, busy, conn)
            continue
          why = f"the reward's worker process died (exit {code})"
          self._fail_call(w, out, skips, tasks, busy, conn, outcomes.CODES["raised"], why)
          continue
        if msg[0] == "unloadable":
          raise ConfigError(_unloadable(env, f"a worker cannot unpickle it: {msg[1]}"))
        if msg[0] == "missing":
          w.held.discard(key)
          self._requeue(tasks, w.todo, busy, conn)
          continue
        if msg[0] == "term":
          w.term = msg[1]
          continue
        w.deadline = time.monotonic() + budget + GRACE
        if msg[0] == "loaded":
          continue
        out[w.todo.pop(0)] = outcomes.Outcome(*msg[1])
        w.term = None
        if not w.todo:
          del busy[conn]
      now = time.monotonic()
      for conn, w in list(busy.items()):
        if conn in busy and w.deadline <= now and w.todo:
          self._replace(w)
          kind, why = outcomes.timed_out(budget)[1:3]
          self._fail_call(w, out, skips, tasks, busy, conn, kind, why)

  def _fail_call(self, w, out, skips, tasks, busy, conn, code, detail) -> None:
    """``w``'s call failed by taking its worker down (death or a hang). In a row of several
    terms only the term it was in fails: the row is scored again without it, so the others
    keep their values; a single call scores 0 with ``code``."""
    row, rest = w.todo[0], w.todo[1:]
    if w.term is not None:
      skips.setdefault(row, {})[w.term] = (code, f"{detail}, in this term")
      rest = [row, *rest]
    else:
      out[row] = outcomes.Outcome(0.0, code, detail)
    self._requeue(tasks, rest, busy, conn)

  @staticmethod
  def _requeue(tasks, todo, busy, conn) -> None:
    busy.pop(conn, None)
    if todo:
      tasks.appendleft(list(todo))

  def _replace(self, w: _Worker) -> int | None:
    """Kills ``w`` and puts a fresh worker in its place; ``w``'s exit code."""
    code = w.stop()
    self._workers[self._workers.index(w)] = self._new_worker()
    return code

  def _new_worker(self) -> _Worker:
    """A fresh worker. A fork server that is gone (a reward term killed it) is restarted once
    (multiprocessing relaunches one it sees dead; one that dies mid-request is stopped and
    relaunched here), counted in ``restarts`` and reported once."""
    from multiprocessing import forkserver  # pylint: disable=import-outside-toplevel

    server = forkserver._forkserver  # pylint: disable=protected-access
    before = server._forkserver_pid  # pylint: disable=protected-access
    try:
      worker = _Worker(self._mp)
    except (EOFError, OSError):
      server._stop()  # pylint: disable=protected-access
      worker = _Worker(self._mp)
      before = before or -1
    if before is not None and server._forkserver_pid != before:  # pylint: disable=protected-access
      self.restarts += 1
      if self.restarts == 1:
        print(
          "warning: the reward workers' fork server died (a reward term may have killed it); "
          "restarted it, the calls in flight are redone once (shown once)",
          file=sys.stderr,
          flush=True,
        )
    return worker

  def close(self) -> None:
    for w in self._workers:
      w.stop()
    self._workers = []


_POOL: Pool | None = None
_POOL_LOCK = threading.Lock()


def pool(size: int) -> Pool:
  """This process's worker pool, started on first use, resized to ``size`` workers."""
  global _POOL
  with _POOL_LOCK:
    if _POOL is None:
      _POOL = Pool(size)
      atexit.register(_POOL.close)
    _POOL.size = size
    return _POOL


def _unloadable(env: str, why: str) -> str:
  return (
    f"the reward of env {env!r} cannot be sent to the reward worker processes ({why}); "
    "define the env's class at module level of an importable module, or set "
    "config.reward.workers=0 to score in this process (no timeout)"
  )


class Scorer:
  """Scores batches for one run; remembers which failure kinds it has already printed.

  Attributes:
    timeout: seconds per reward call (enforced with ``workers > 0``).
    workers: worker processes (0: call in this process).
    max_error_rate: the largest fraction of failed calls in a step (or an evaluation) that
      does not stop the run.
  """

  def __init__(self, *, timeout: float, workers: int, max_error_rate: float, out=None):
    self.timeout, self.workers, self.max_error_rate = timeout, workers, max_error_rate
    self._out = out
    self.warned: set[int] = set()
    if not workers:
      self._print(
        "warning: config.reward.workers=0 scores rewards in this process; "
        "config.reward.timeout is not enforced (a reward that hangs hangs the run)"
      )
    else:  # the workers start while the run compiles (Pool.start waits for nothing else)
      threading.Thread(
        target=lambda: pool(workers).start(), name="reward-pool-start", daemon=True
      ).start()

  def _print(self, line: str) -> None:
    print(line, file=self._out or sys.stderr, flush=True)

  def score_outcomes(
    self, verifier, problems, completions, *, env: str, quiet: bool = False
  ) -> list[outcomes.Outcome]:
    """The :class:`~outcomes.Outcome` of each (problem, completion): ``verifier.verify`` (an
    env or a dataset; or ``verifier(problem, completion)``, a reward function of an importable
    module; or ``verifier.score_row``, several terms: rewards/terms.py). Unless ``quiet``, the
    first failure of each kind is printed; ``env`` names the verifier in messages."""
    problems, completions = list(problems), list(completions)
    if self.workers:
      results = pool(self.workers).run(verifier, problems, completions, self.timeout, env)
    else:
      results = [score_row(verifier, p, c) for p, c in zip(problems, completions)]
    for p, c, r in zip(problems, completions, results):
      if not quiet and r.code != outcomes.OK and r.code not in self.warned:
        self.warned.add(r.code)
        self._print(outcomes.warning(getattr(p, "env", env) or env, p, c, r))
    return results

  def score(self, verifier, problems, completions, *, env: str) -> tuple[np.ndarray, np.ndarray]:
    """``(rewards [N] float32, kind codes [N] int32)`` of :meth:`score_outcomes`."""
    results = self.score_outcomes(verifier, problems, completions, env=env)
    return (
      np.asarray([r.reward for r in results], np.float32).reshape(len(results)),
      np.asarray([r.code for r in results], np.int32).reshape(len(results)),
    )

  def check(self, codes, mask=None, *, where: str, env: str) -> None:
    """Raises TrainingError when more than ``max_error_rate`` of the calls (rows where
    ``mask``) failed."""
    message = outcomes.rate_error(codes, mask, where=where, env=env, max_rate=self.max_error_rate)
    if message:
      raise TrainingError(message)
