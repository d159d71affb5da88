"""Checkpoints: asynchronous saves, keep-last-N, only finalised steps count, restore on one device."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posttrain_jax import io as ptio
from posttrain_jax import models
from posttrain_jax.io import checkpoint as ckpt_lib
from posttrain_jax.train import state as state_lib


def _tree(step: int) -> dict:
  return {"w": jnp.full((3, 2), float(step)), "step": jnp.int32(step)}


def test_async_saves_keep_last_n(tmp_path):
  ckpt = ptio.Checkpointer(str(tmp_path), max_to_keep=2, async_save=True)
  for step in range(1, 5):
    ckpt.save(step, _tree(step), {"step": step})
  ckpt.close()
  assert ckpt.all_steps() == [3, 4] and ckpt.latest_step() == 4
  for step in (3, 4):
    assert os.path.exists(tmp_path / str(step) / ckpt_lib.COMMIT_MARKER)
  state, meta = ptio.Checkpointer(str(tmp_path)).restore(_tree(0))
  assert meta == {"step": 4} and float(state["w"][0, 0]) == 4.0


def test_step_without_commit_marker_is_ignored_and_removed(tmp_path):
  ckpt = ptio.Checkpointer(str(tmp_path), max_to_keep=3)
  ckpt.save(1, _tree(1), {"step": 1})
  ckpt.save(2, _tree(2), {"step": 2})
  ckpt.wait()
  # A half-written step 3 (as a save on a filesystem without atomic rename leaves it when
  # killed): the files are there but not the commit marker.
  shutil.copytree(tmp_path / "2", tmp_path / "3")
  os.remove(tmp_path / "3" / ckpt_lib.COMMIT_MARKER)
  os.makedirs(tmp_path / "4.orbax-checkpoint-tmp-123")  # an interrupted atomic-rename save
  assert ckpt.latest_step() == 2 and ckpt.all_steps() == [1, 2]
  ckpt.close()
  reopened = ptio.Checkpointer(str(tmp_path), max_to_keep=3)
  assert reopened.latest_step() == 2
  assert not os.path.exists(tmp_path / "3")  # deleted when the folder was opened
  state, meta = reopened.restore(_tree(0))
  assert meta == {"step": 2} and float(state["w"][0, 0]) == 2.0
  reopened.save(3, _tree(3), {"step": 3})  # the step number is free again
  reopened.close()
  assert ckpt_lib.finalised_steps(str(tmp_path)) == [1, 2, 3]


def test_no_checkpoint_raises(tmp_path):
  with pytest.raises(ptio.CheckpointError, match="no checkpoint"):
    ptio.Checkpointer(str(tmp_path / "empty")).restore(_tree(0))


def test_restore_params_single_device(tmp_path):
  cfg = models.preset("nano", vocab_size=19)
  _, params = nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0)))
  tx = state_lib.make_optimizer(lr=1e-3, steps=2)
  final = ptio.Checkpointer(str(tmp_path / "final"), max_to_keep=1)
  final.save(0, params, {"stage": "rl"})
  final.close()
  run = ptio.Checkpointer(str(tmp_path / "checkpoints"), async_save=True)
  run.save(5, {"policy": state_lib.init_state(params, tx), "history": []}, {"step": 5})
  run.close()
  want = nnx.to_pure_dict(params)
  for folder in ("final", "checkpoints"):
    got = ckpt_lib.restore_params_single_device(str(tmp_path / folder))
    assert jax.tree.structure(got) == jax.tree.structure(want), folder
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_array_equal(a, b)
      assert a.sharding == jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  state, meta = ckpt_lib.restore_single_device(str(tmp_path / "final"), params)
  assert meta == {"stage": "rl"} and isinstance(state, nnx.State)


def test_manifest_verified_and_fallback_sets_bad_steps_aside(tmp_path):
  ckpt = ptio.Checkpointer(str(tmp_path), max_to_keep=3, async_save=True)
  for step in (1, 2, 3):
    ckpt.save(step, _tree(step), {"step": step})
  ckpt.close()
  for step in (1, 2, 3):
    assert os.path.exists(tmp_path / str(step) / ckpt_lib.MANIFEST)
  os.remove(tmp_path / "3" / "meta" / os.listdir(tmp_path / "3" / "meta")[0])
  with open(tmp_path / "2" / ckpt_lib.MANIFEST, "a", encoding="utf-8") as f:
    f.write("x")  # an unreadable manifest is a bad step too
  reopened = ptio.Checkpointer(str(tmp_path), max_to_keep=3)
  with pytest.raises(
    ptio.CheckpointError,
    match=r"/3 is corrupt: meta/\S+ is missing; rerun "
    "the same command with --fallback_checkpoint",
  ) as err:
    reopened.restore_latest(_tree(0))
  assert err.value.fallback
  state, meta = reopened.restore_latest(_tree(0), fallback=True)
  assert meta == {"step": 1} and float(state["w"][0, 0]) == 1.0
  assert sorted(os.listdir(tmp_path)) == ["1", "2.corrupt", "3.corrupt"]
  reopened.save(2, _tree(2), {"step": 2})  # the numbers are free again; .corrupt is ignored
  reopened.close()
  assert ckpt_lib.finalised_steps(str(tmp_path)) == [1, 2]
  assert ptio.Checkpointer(str(tmp_path)).restore_latest(_tree(0))[1] == {"step": 2}


def test_fallback_past_every_step_restarts_the_stage(tmp_path):
  ckpt = ptio.Checkpointer(str(tmp_path), max_to_keep=2)
  ckpt.save(1, _tree(1), {"step": 1})
  ckpt.close()
  with open(tmp_path / "1" / ckpt_lib.MANIFEST, "w", encoding="utf-8") as f:
    f.write('{"state/nope": "0"}')
  assert ptio.Checkpointer(str(tmp_path)).restore_latest(_tree(0), fallback=True) is None
  assert os.listdir(tmp_path) == ["1.corrupt"]
