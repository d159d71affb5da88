"""A checkpoint saved on mesh A (1, 4, 2) of 8 fake CPU devices restores onto mesh A, onto mesh
B (2, 2, 2) and onto one device, and training continues with the losses of an uninterrupted
run (mesh_check.py runs it in a subprocess)."""

import mesh_fixtures


def test_restore_onto_other_meshes_and_one_device(tmp_path):
  out = mesh_fixtures.run_check("ckpt", tmp_path)
  full = out["uninterrupted"]
  # Same mesh: bit-identical. Another mesh or one device: reductions run in another order, so
  # the stated tolerance is 1e-5 relative.
  assert out["mesh_a"]["losses"] == full
  for name in ("mesh_b", "one_device"):
    for got, want in zip(out[name]["losses"], full):
      assert abs(got - want) <= 1e-5 * abs(want), (name, out[name]["losses"], full)
  assert out["mesh_a"]["meta"] == {"step": 2}
  assert out["mesh_a"]["meshes"] == ["{'data': 1, 'fsdp': 4, 'tensor': 2}"]
  assert out["mesh_b"]["meshes"] == ["{'data': 2, 'fsdp': 2, 'tensor': 2}"]
  for name in ("mesh_a", "mesh_b"):  # restored with the target's shardings, Adam state too
    specs = out[name]["specs"]
    assert specs["params"] == mesh_fixtures.TRAINER_SPECS
    assert specs["opt"]["1/0/mu/layers/q"] == "(None, 'fsdp', 'tensor', None)"
    assert specs["opt"]["1/0/nu/embed"] == "('tensor', 'fsdp')"
  assert out["one_device"]["devices"] == ["cpu:0"]
  assert out["pure_params_equal"] and out["pure_params_devices"] == ["cpu:0"]
