"""Multi-process (multi-host) runs: initialisation and host <-> global array helpers.

One process per host. ``initialize`` must run before anything touches the JAX backend. Every
process then runs the same program (SPMD): each builds its own rows of a batch from host data
(:func:`local_row_range`, :func:`from_local_rows`), computes host-side results (rewards) on
them (:func:`local_rows`), and only process 0 writes metrics and progress (:func:`is_primary`).
With one process every helper reduces to the plain single-host operation.
"""

import os

import jax
import numpy as np
from jax.experimental import multihost_utils

ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


def distributed_settings(
  coordinator_address: str = "", num_processes: int = 0, process_id: int = -1
) -> tuple[str, int, int]:
  """``(coordinator, num_processes, process_id)`` from the arguments, else from the
  environment (``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``).
  Empty / 0 / -1 mean unset. Raises ValueError when the settings are incomplete."""
  env = os.environ
  coordinator = coordinator_address or env.get(ENV_COORDINATOR, "")
  try:
    n = int(num_processes or env.get(ENV_NUM_PROCESSES, "0") or 0)
    pid = int(process_id if process_id >= 0 else env.get(ENV_PROCESS_ID, "-1") or -1)
  except ValueError as e:
    raise ValueError(f"{ENV_NUM_PROCESSES} / {ENV_PROCESS_ID} must be integers ({e})") from None
  if not coordinator:
    if n > 1 or pid >= 0:
      raise ValueError(
        f"num_processes={n}, process_id={pid} given without a coordinator "
        f"address; set distributed.coordinator_address (or {ENV_COORDINATOR}) "
        "to HOST:PORT of process 0"
      )
    return "", 0, -1
  if n < 1 or not 0 <= pid < n:
    raise ValueError(
      f"coordinator {coordinator!r} needs num_processes >= 1 and "
      f"0 <= process_id < num_processes, got num_processes={n}, "
      f"process_id={pid}"
    )
  return coordinator, n, pid


def initialize(
  coordinator_address: str = "",
  num_processes: int = 0,
  process_id: int = -1,
  *,
  timeout: int = 300,
  auto_detect: bool = False,
) -> bool:
  """``jax.distributed.initialize`` when a coordinator is configured (or ``auto_detect`` asks
  JAX to read SLURM / Open MPI / TPU / Kubernetes settings). Returns whether this is a
  distributed run. Call it before any other JAX use; a second call is a no-op."""
  if jax.distributed.is_initialized():
    return True
  coordinator, n, pid = distributed_settings(coordinator_address, num_processes, process_id)
  if not coordinator and not auto_detect:
    return False
  kwargs = dict(initialization_timeout=timeout)
  if coordinator:
    kwargs.update(coordinator_address=coordinator, num_processes=n, process_id=pid)
  jax.distributed.initialize(**kwargs)
  return True


def is_primary() -> bool:
  """Whether this process writes metrics, progress and other single-writer files."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Waits until every process reaches ``barrier(name)`` (no-op with one process)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def local_row_range(sharding: jax.sharding.Sharding, rows: int) -> tuple[int, int]:
  """``(lo, hi)``: the contiguous rows this process's devices hold of a ``rows``-row array
  placed with ``sharding`` (all rows when they are replicated)."""
  spans = set()
  for index in sharding.addressable_devices_indices_map((rows,)).values():
    spans.add(index[0].indices(rows)[:2] if index else (0, rows))
  lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
  covered = np.zeros(rows, bool)
  for a, b in spans:
    covered[a:b] = True
  if not covered[lo:hi].all():
    raise ValueError(f"this process's rows of {sharding} are not contiguous: {sorted(spans)}")
  return lo, hi


def from_local_rows(local, sharding: jax.sharding.Sharding, rows: int):
  """A global array (or tree) of ``rows`` rows from this process's rows ``local`` (the
  ``local_row_range`` block, for every leaf)."""

  def one(x):
    x = np.asarray(x)
    return jax.make_array_from_process_local_data(sharding, x, (rows,) + x.shape[1:])

  return jax.tree.map(one, local)


def local_rows(x: jax.Array) -> np.ndarray:
  """This process's block of rows of ``x`` (see :func:`local_row_range`) as numpy."""
  if x.is_fully_addressable:
    return np.asarray(x)
  rows = x.shape[0]
  lo, hi = local_row_range(x.sharding, rows)
  out = np.empty((hi - lo,) + x.shape[1:], x.dtype)
  for shard in x.addressable_shards:
    index = shard.index
    start, stop, _ = index[0].indices(rows) if index else (0, rows, 1)
    rest = index[1:] if index else ()
    if any(s.indices(n)[:2] != (0, n) for s, n in zip(rest, x.shape[1:])):
      raise ValueError("local_rows needs arrays sharded along rows only")
    out[start - lo : stop - lo] = np.asarray(shard.data)
  return out


def to_host(x):
  """The full value of ``x`` (a tree) as numpy on every process."""

  def one(a):
    if not isinstance(a, jax.Array) or a.is_fully_addressable or a.is_fully_replicated:
      return np.asarray(a)
    return np.asarray(multihost_utils.process_allgather(a, tiled=True))

  return jax.tree.map(one, x)
