"""The trainer and sampler on 8 fake CPU devices, mesh (1, 4, 2): parameter and optimiser-state
PartitionSpecs, one sharded RL update against the single-device one, sharded greedy sampling
against single-device sampling (mesh_check.py runs it in a subprocess)."""

import mesh_fixtures

TRAINER_SPECS = mesh_fixtures.TRAINER_SPECS
SAMPLER_SPECS = mesh_fixtures.SAMPLER_SPECS


def test_specs_sharded_update_and_sampling(tmp_path):
  out = mesh_fixtures.run_check("shard", tmp_path)
  # (a) parameters, then Adam's mu and nu leaf by leaf: the parameter's spec; counts replicated.
  assert out["devices"] == 8
  assert out["param_specs"] == TRAINER_SPECS
  opt = out["opt_specs"]
  for moment in ("mu", "nu"):
    assert {
      k.split(f"/{moment}/")[1]: v for k, v in opt.items() if f"/{moment}/" in k
    } == TRAINER_SPECS, moment
  assert {k: v for k, v in opt.items() if k.endswith("count")} == {
    "1/0/count": "()",
    "1/2/count": "()",
  }
  assert len(opt) == 2 * len(TRAINER_SPECS) + 2
  # (b) one update on the same batch: parameters, optimiser state and metrics within 1e-5
  # relative (per-leaf norm) of the single-device update. Two minibatches: the first update's
  # float-reduction differences reach the second through Adam's per-element normalisation, so
  # the stated tolerance is 3e-5 there. The sharded shared-prompt forward against the
  # single-device per-row forward: 1e-5 too.
  for name, tol in (("minibatches=1", 1e-5), ("minibatches=2", 3e-5), ("shared_prefix", 1e-5)):
    u = out["update"][name]
    assert u["params_rel"] < tol and u["opt_rel"] < tol and u["metrics_rel"] < 1e-5, (name, u)
    assert u["specs_kept"] and u["metrics_replicated"], (name, u)
  assert out["update"]["minibatches=2"]["step"] == 2
  # (c) greedy sampling from the sampler's tensor-parallel copy: the same tokens.
  s = out["sample"]
  assert s["tokens_equal"], s
  assert s["logprobs_diff"] < 1e-5
  assert s["rows_spec"] == "('fsdp',)"  # rows over data x fsdp (data has size 1)
  assert s["policy_version"] == [7] * 8
  assert s["copy_specs"] == SAMPLER_SPECS
  # The float32 copy is rebuilt only for a new weight version; so is the bfloat16 one
  # (versions 0, 0, 1 -> 2 rebuilds).
  assert s["float32_copy_is_cached"] and s["bf16_resyncs"] == 2
