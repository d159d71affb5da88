"""The sampler on a mesh of its own (config.sampler_mesh over config.cpu_devices CPU devices),
the trainer on device 0: the same tokens as on the trainer's mesh, rollouts moved back to the
trainer's rows, a weight copy that survives the trainer's donation, a whole RL + eval run whose
records equal the shared-mesh run's, and clear errors (sampler_mesh_check.py, a subprocess:
the device count is fixed when JAX starts)."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "parallel"))

import mesh_fixtures  # noqa: E402


@pytest.fixture(scope="module")
def check(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("sampler_mesh")
  script = os.path.join(os.path.dirname(__file__), "sampler_mesh_check.py")
  proc = subprocess.run(
    [sys.executable, script, str(workdir)],
    capture_output=True,
    text=True,
    timeout=600,
    env=mesh_fixtures.env(),
    cwd=REPO,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_sampler_on_its_own_mesh_samples_the_same_tokens(check):
  assert check["devices"] == 2
  assert check["trainer_devices"] == [0] and check["sampler_devices"] == [0, 1]
  assert check["shared_rows_devices"] == [0] and check["own_rows_devices"] == [0, 1]
  assert check["tokens_equal"] and check["logprobs_diff"] < 1e-5
  assert check["moved_devices"] == [0]  # rows_here: onto the trainer's rows
  # A cached copy does not alias the trainer's (donated) buffers; a float32 one onto devices
  # the trainer's arrays share is redone each call instead of cached.
  for name, devices in (("overlapping_bf16", [0, 1]), ("disjoint", [1])):
    assert check[f"cached_{name}"] and check[f"copy_survives_delete_{name}"], name
    assert check[f"copy_devices_{name}"] == devices, name
  assert check["overlapping_f32"] == {
    "resyncs": 1,
    "cached": False,
    "devices": [0, 1],
    "equal": True,
  }


def test_rl_and_eval_with_the_sampler_mesh_match_the_shared_mesh(check):
  own, shared = check["runs"]["own"], check["runs"]["shared"]
  assert len(own["records"]) == len(shared["records"]) == 4
  assert [r["sampler/weight_version"] for r in own["records"]] == [0.0, 1.0, 2.0, 3.0]
  assert any(r["reward/mean"] > 0 for r in own["records"])  # groups had a signal
  for a, b in zip(own["records"], shared["records"]):
    assert set(a) == set(b)
    for k, v in a.items():
      if isinstance(v, float) and not k.startswith("time/"):
        assert v == pytest.approx(b[k], rel=1e-5, abs=1e-6), (a["step"], k)
  assert set(own["summary"]) == set(shared["summary"])
  for k, v in own["summary"].items():
    want = shared["summary"][k]
    assert v == (pytest.approx(want, rel=1e-6) if isinstance(v, float) else want), k
  assert "accuracy_after_rl" in own["summary"]


def test_bad_device_index_and_late_cpu_devices_are_config_errors(check):
  err = check["errors"]
  assert "config.sampler_mesh.devices=(0, 5)" in err["device_index"]
  assert "0..1" in err["device_index"]
  assert "config.cpu_devices=3" in err["late"] and "already started with 2" in err["late"]
  assert "jax_num_cpu_devices" in err["late"]
