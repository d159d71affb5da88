"""Where a run's arrays live (DESIGN.md section 7).

One mesh per run, built from ``config.mesh`` (default ``(1, -1, 1)`` over
``('data', 'fsdp', 'tensor')``: FSDP over every device; 1x1x1 on one device). Parameters of the
policy, reference and critic are placed with the trainer role's rules (FSDP + TP), optimiser
states with shardings derived from the parameters', batches with rows over the ``batch`` axes;
the sampler reads a copy in the sampler role's layout (rollout.InferenceWeights).

In a multi-process run each process builds its own rows of every batch
(:meth:`Placement.local_rows`, :meth:`Placement.from_local`).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from posttrain_jax import parallel
from posttrain_jax.registry import ConfigError
from posttrain_jax.train import state as state_lib


@dataclasses.dataclass(frozen=True)
class StepShardings:
  """In/out shardings of a jitted step.

  Attributes:
    mesh: the mesh.
    state: shardings of the donated state (same tree as the TrainState).
    batch: sharding of every batch array (rows over the batch axes; any rank).
    replicated: sharding of scalars, keys and controls.
    rules: the rule table activations are constrained with.
  """

  mesh: jax.sharding.Mesh
  state: object
  batch: jax.sharding.NamedSharding
  replicated: jax.sharding.NamedSharding
  rules: tuple


DEFAULT_MESH_SHAPE = (1, -1, 1)


def mesh_devices(mesh_cfg, devices=None, name: str = "config.mesh") -> list:
  """The devices a mesh section spans: ``devices`` (default ``jax.devices()``), or those of its
  ``devices`` entry (indices into that list; empty: all). ConfigError for a bad index."""
  devices = list(jax.devices() if devices is None else devices)
  index = tuple(mesh_cfg.get("devices", ()) or ()) if mesh_cfg is not None else ()
  if not index:
    return devices
  if jax.process_count() > 1:
    raise ConfigError(
      f"{name}.devices={index} picks devices, which a multi-process run "
      "cannot do yet (every process must hold devices of the mesh); leave it "
      "empty there"
    )
  bad = [i for i in index if not isinstance(i, int) or not 0 <= i < len(devices)]
  if bad or len(set(index)) != len(index):
    raise ConfigError(
      f"{name}.devices={index} must be distinct indices into the "
      f"{len(devices)} device(s) of this run (0..{len(devices) - 1}); empty "
      "means all of them"
    )
  return [devices[i] for i in index]


def mesh_from_config(mesh_cfg, devices=None, name: str = "config.mesh") -> jax.sharding.Mesh:
  """The mesh ``config.mesh`` describes over ``devices`` (default all, or the indices of its
  ``devices`` entry; no ``config.mesh``: FSDP over all); ConfigError if the device count does
  not fit its shape."""
  devices = mesh_devices(mesh_cfg, devices, name)
  if mesh_cfg is None:
    return parallel.make_mesh(DEFAULT_MESH_SHAPE, parallel.MESH_AXES, devices=devices)
  try:
    return parallel.make_mesh(tuple(mesh_cfg.shape), tuple(mesh_cfg.axes), devices=devices)
  except ValueError as e:
    raise ConfigError(
      f"{name}.shape={tuple(mesh_cfg.shape)} does not fit the "
      f"{len(devices)} device(s) it spans ({e}); use one -1 for 'the rest', "
      "e.g. (1, -1, 1)"
    ) from None


def sampler_mesh_from_config(config, devices=None) -> jax.sharding.Mesh | None:
  """The sampler's own mesh (``config.sampler_mesh``), or None when its shape is empty: the
  sampler then shares the run's mesh (the default). See DESIGN.md section 7 and
  :func:`rollout_to_trainer`."""
  section = config.get("sampler_mesh", None)
  if section is None or not tuple(section.get("shape", ()) or ()):
    return None
  if jax.process_count() > 1:
    raise ConfigError(
      "config.sampler_mesh (a mesh of the sampler's own) works in one process "
      "only for now (each process builds the rows of the trainer's split); "
      "leave config.sampler_mesh.shape empty in a multi-process run"
    )
  return mesh_from_config(section, devices, "config.sampler_mesh")


class Placement:
  """Shardings and placement helpers of one mesh."""

  def __init__(self, mesh: jax.sharding.Mesh):
    self.mesh = mesh
    self.replicated = parallel.replicated(mesh)

  # -- parameters and train states ------------------------------------------------------------
  def param_shardings(self, params, role: str = "trainer"):
    return parallel.param_shardings(params, self.mesh, role)

  def place(self, params, role: str = "trainer"):
    """``params`` placed with ``role``'s rules (host values must match across processes)."""
    return parallel.put(params, self.param_shardings(params, role))

  def state_shardings(self, params, tx) -> state_lib.TrainState:
    """Shardings of ``TrainState(step, params, tx.init(params))``: the parameters' from the
    trainer rules, the optimiser state's derived from them, the step replicated."""
    param_sh = self.param_shardings(params)
    return state_lib.TrainState(
      step=self.replicated,
      params=param_sh,
      opt_state=parallel.optimizer_shardings(tx, params, param_sh, self.mesh),
    )

  def init_state(self, params, tx) -> state_lib.TrainState:
    """A fresh TrainState on a copy of ``params``, created directly in its shardings."""
    shardings = self.state_shardings(params, tx)
    init = jax.jit(
      lambda p: state_lib.TrainState(
        step=jnp.zeros((), jnp.int32), params=jax.tree.map(jnp.copy, p), opt_state=tx.init(p)
      ),
      out_shardings=shardings,
    )
    return init(self.place(params))

  def step_shardings(self, state_shardings, rows: int) -> StepShardings:
    return StepShardings(
      mesh=self.mesh,
      state=state_shardings,
      batch=self.rows(rows),
      replicated=self.replicated,
      rules=parallel.resolve_rules("trainer"),
    )

  # -- batches ----------------------------------------------------------------------------------
  def rows(self, n: int) -> jax.sharding.NamedSharding:
    """The sharding of an ``n``-row batch."""
    return parallel.batch_sharding(self.mesh, n)

  def local_rows(self, n: int) -> tuple[int, int]:
    """``(lo, hi)``: the rows of an ``n``-row batch this process builds."""
    return parallel.local_row_range(self.rows(n), n)

  def from_local(self, local, n: int):
    """A global ``n``-row batch (tree) from this process's rows ``local``."""
    return parallel.from_local_rows(local, self.rows(n), n)

  def put_rows(self, host, n: int):
    """A global ``n``-row batch from host values that are the same in every process."""
    return parallel.put(jax.tree.map(np.asarray, host), self.rows(n))

  def put_replicated(self, tree):
    return parallel.put(tree, self.replicated)

  def rows_here(self, tree, n: int):
    """An ``n``-row batch (tree of arrays) moved onto this mesh's row sharding: a no-op for
    arrays that lie so already (the sampler on the run's mesh), a copy for arrays of another
    mesh (the sampler's own, ``config.sampler_mesh``)."""
    rows = self.rows(n)
    move = lambda x: (
      x
      if not isinstance(x, jax.Array)
      or x.sharding.is_equivalent_to(rows if x.ndim else self.replicated, x.ndim)
      else jax.device_put(x, rows if x.ndim else self.replicated)
    )
    return jax.tree.map(move, tree)
