"""Placement rules, mesh / distributed config checks and the sampler's weight copy on one device
(the 8-device and 2-process checks are in test_mesh*.py and test_multihost.py)."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from posttrain_jax import defaults, models, parallel, rollout
from posttrain_jax import io as ptio
from posttrain_jax.methods import validate
from posttrain_jax.train import ConfigError
from posttrain_jax.train import placement as placement_lib

MESH = AbstractMesh((2, 4, 2), ("data", "fsdp", "tensor"))


@pytest.mark.parametrize(
  "names, shape, want",
  [
    (("vocab", "embed"), (32, 64), P("tensor", "fsdp")),
    (("layers", "embed", "kv_heads", "head_dim"), (2, 64, 3, 16), P(None, "fsdp", None, None)),
    (("embed", "embed"), (8, 8), P("fsdp", None)),  # an axis shards one dimension only
    (("vocab", "nope"), (4, 4), P("tensor", None)),  # unknown names stay replicated
    (("batch",), (16,), P(("data", "fsdp"))),
    (("batch",), (6,), P("data")),  # longest dividing prefix of the axes
    (("batch",), (3,), P(None)),
    (None, (4, 4), P(None, None)),
  ],
)
def test_logical_spec_fallbacks(names, shape, want):
  assert parallel.logical_spec(names, shape, MESH, "trainer") == want


def test_expert_axis_shards_moe_weights_when_the_mesh_has_one():
  names, shape = ("layers", "expert", "embed", "mlp"), (2, 4, 64, 256)
  assert parallel.logical_spec(names, shape, MESH, "trainer") == P(None, None, "fsdp", "tensor")
  moe = AbstractMesh((1, 2, 2, 2), ("data", "fsdp", "tensor", "expert"))
  assert parallel.logical_spec(names, shape, moe, "trainer") == P(None, "expert", "fsdp", "tensor")
  assert parallel.logical_spec(names, shape, moe, "sampler") == P(None, "expert", None, "tensor")
  validate(_config(shape=(1, -1, 1, 1), axes=("data", "fsdp", "tensor", "expert")))


def test_logical_spec_roles_and_size_one_axes():
  assert parallel.logical_spec(("vocab", "embed"), (32, 64), MESH, "sampler") == P("tensor", None)
  one = AbstractMesh((1, 1, 1), ("data", "fsdp", "tensor"))
  assert parallel.logical_spec(("vocab", "embed"), (32, 64), one, "trainer") == P(None, None)
  with pytest.raises(ValueError, match="valid roles"):
    parallel.logical_spec(("vocab",), (4,), MESH, "critic")


def _config(**mesh):
  c = defaults.base_config()
  c.mesh.update(mesh)
  return c


def test_mesh_config_validation():
  validate(_config())
  for mesh, needle in [
    (dict(shape=(1, -1, -1)), "at most one axis"),
    (dict(shape=(1, 2)), "one size per axis"),
    (dict(axes=("data", "fsdp", "model")), "distinct names"),
    (dict(shape=(1, 0, 1)), "positive sizes"),
  ]:
    with pytest.raises(ConfigError, match=needle):
      validate(_config(**mesh))
  with pytest.raises(ConfigError, match=r"config.mesh.shape=\(3, -1, 1\) does not fit"):
    placement_lib.mesh_from_config(
      ml_collections.ConfigDict(dict(shape=(3, -1, 1), axes=("data", "fsdp", "tensor")))
    )
  mesh = placement_lib.mesh_from_config(defaults.base_config().mesh)
  assert dict(mesh.shape) == {"data": 1, "fsdp": 1, "tensor": 1}


def test_sampler_mesh_and_cpu_devices_config_checks():
  """config.sampler_mesh / config.mesh.devices / config.cpu_devices (the two-device runs are in
  tests/train/test_sampler_mesh.py)."""
  c = defaults.base_config()
  assert placement_lib.sampler_mesh_from_config(c) is None  # empty shape: the run's mesh
  c.sampler_mesh.shape = (1, 1, 1)
  validate(c)
  assert dict(placement_lib.sampler_mesh_from_config(c).shape) == {
    "data": 1,
    "fsdp": 1,
    "tensor": 1,
  }
  for update, needle in [
    (dict(shape=(1, 2)), r"config.sampler_mesh.shape=\(1, 2\) needs one"),
    (dict(devices=(0, 0)), "config.sampler_mesh.devices=.* distinct"),
    (dict(devices=(-1,)), "distinct device indices >= 0"),
  ]:
    bad = defaults.base_config()
    bad.sampler_mesh.update({"shape": (1, 1, 1), **update})
    with pytest.raises(ConfigError, match=needle):
      validate(bad)
  with pytest.raises(
    ConfigError,
    match=r"config.mesh.devices=\(3,\) must be distinct indices "
    r"into the 1 device",
  ):
    placement_lib.mesh_from_config(
      ml_collections.ConfigDict(
        dict(shape=(1, 1, 1), axes=("data", "fsdp", "tensor"), devices=(3,))
      )
    )
  bad = defaults.base_config()
  bad.cpu_devices = -1
  with pytest.raises(ConfigError, match="config.cpu_devices must be an integer >= 0"):
    validate(bad)
  # On a backend that already runs (this process: one CPU device), asking for that count is
  # a no-op and another count a clear error.
  parallel.set_cpu_devices(len(jax.devices("cpu")))
  with pytest.raises(ValueError, match="already started with 1 device"):
    parallel.set_cpu_devices(3)


def test_distributed_settings(monkeypatch):
  for var in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    monkeypatch.delenv(var, raising=False)
  assert parallel.distributed_settings() == ("", 0, -1)
  assert parallel.distributed_settings("h:1", 2, 1) == ("h:1", 2, 1)
  with pytest.raises(ValueError, match="without a coordinator"):
    parallel.distributed_settings("", 2, 0)
  with pytest.raises(ValueError, match="process_id < num_processes"):
    parallel.distributed_settings("h:1", 2, 2)
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
  monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
  monkeypatch.setenv("JAX_PROCESS_ID", "3")
  assert parallel.distributed_settings() == ("10.0.0.1:1234", 4, 3)
  c = defaults.base_config()
  c.distributed.update(num_processes=2, process_id=0)
  for var in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    monkeypatch.delenv(var)
  with pytest.raises(ConfigError, match="config.distributed"):
    validate(c)
  from posttrain_jax import main as main_lib

  with pytest.raises(ConfigError, match="coordinator"):
    main_lib.init_distributed(c)
  assert main_lib.init_distributed(defaults.base_config()) is False  # single process: no-op


def test_constrain_is_identity_without_a_mesh_context():
  x = jnp.ones((4, 8))
  assert parallel.constrain(x, ("batch", "act_embed")) is x
  mesh = parallel.make_mesh((1, 1, 1))
  with parallel.activation_sharding(mesh, "trainer"):
    y = jax.jit(lambda a: parallel.constrain(a, ("batch", "act_embed")) * 2)(x)
  np.testing.assert_array_equal(y, 2 * x)
  with parallel.activation_sharding(None):
    assert parallel.constrain(x, ("batch",)) is x


def test_put_places_committed_arrays_and_prefix_trees():
  mesh = parallel.make_mesh((1, 1, 1))
  place = placement_lib.Placement(mesh)
  tree = {
    "a": jax.device_put(jnp.ones(4), jax.devices()[0]),
    "b": np.zeros((2, 3)),
    "k": jax.random.key(0),
  }
  out = parallel.put(tree, place.replicated)
  assert all(x.sharding.is_equivalent_to(place.replicated, x.ndim) for x in jax.tree.leaves(out))
  rows = place.put_rows(np.arange(8), 8)
  assert place.local_rows(8) == (0, 8)
  np.testing.assert_array_equal(parallel.local_rows(rows), np.arange(8))
  np.testing.assert_array_equal(parallel.to_host(rows), np.arange(8))
  local = place.from_local({"x": np.arange(6).reshape(3, 2)}, 3)
  np.testing.assert_array_equal(local["x"], np.arange(6).reshape(3, 2))


@pytest.fixture(scope="module")
def params():
  cfg = models.preset("nano", vocab_size=19)
  graphdef, params = nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0)))
  return placement_lib.Placement(parallel.make_mesh((1, 1, 1))).place(params)


def test_inference_weights_resync_only_on_a_new_version(params):
  mesh = parallel.make_mesh((1, 1, 1))
  shared = rollout.InferenceWeights("float32", mesh=mesh)
  assert shared(params, 0) is params  # same layout and precision: no copy
  assert shared(params, 0) is params and shared.resyncs == 1 and not shared.last_resynced
  int8 = rollout.InferenceWeights("int8", mesh=mesh)
  first = int8(params, 3)
  assert int8(params, 3) is first and not int8.last_resynced  # cached for version 3
  cast = rollout.make_inference_cast("int8")(params)
  for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(cast)):
    np.testing.assert_array_equal(a, b)
  moved = jax.tree.map(lambda x: x + 1.0, params)
  second = int8(moved, 4)
  assert int8.last_resynced and int8.resyncs == 2 and int8.version == 4
  assert not np.array_equal(jax.tree.leaves(second)[0], jax.tree.leaves(first)[0])
  with pytest.raises(ValueError, match="valid"):
    rollout.InferenceWeights("fp8")


def test_state_shardings_derive_optimizer_shardings(params):
  from posttrain_jax.train import state as state_lib

  place = placement_lib.Placement(parallel.make_mesh((1, 1, 1)))
  tx = state_lib.make_optimizer(lr=1e-3, steps=4, weight_decay=0.1)
  shardings = place.state_shardings(params, tx)
  state = place.init_state(params, tx)
  assert int(state.step) == 0
  leaves = jax.tree.leaves(state)
  assert len(leaves) == len(jax.tree.leaves(shardings))
  for x, s in zip(leaves, jax.tree.leaves(shardings)):
    assert x.sharding.is_equivalent_to(s, x.ndim)
  # The caller's parameters survive the state's donation.
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))


def test_metric_writer_disabled_writes_nothing(tmp_path):
  w = ptio.MetricWriter(str(tmp_path), tensorboard=False, enabled=False)
  assert w.write(1, {"a": 1.0}) == {"step": 1, "a": 1.0}
  w.truncate_after(0)
  w.close()
  assert not (tmp_path / "metrics.jsonl").exists()
