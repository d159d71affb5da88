"""The teacher on a mesh of its own (config.rl.teacher.mesh): its parameters on other devices,
the same records as on the run's mesh, and a clear error for a copy of the policy
(teacher_mesh_check.py, a subprocess: the CPU device count is set before JAX starts)."""

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
  workdir = tmp_path_factory.mktemp("teacher_mesh")
  script = os.path.join(os.path.dirname(__file__), "teacher_mesh_check.py")
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


def test_teacher_on_its_own_mesh_matches_the_shared_mesh(check):
  assert check["devices"] == 2 and check["teacher_param_devices"] == [1]
  own, shared = check["runs"]["own"], check["runs"]["shared"]
  assert len(own) == len(shared) == 2
  assert any(r.get("loss/distill", 0) > 1e-4 for r in own)  # the teacher really scored
  for a, b in zip(own, shared):
    assert set(a) == set(b)
    for k, v in a.items():
      if isinstance(v, float) and not k.startswith("time/"):
        assert v == pytest.approx(b[k], rel=1e-5, abs=1e-6), (a["step"], k)


def test_a_mesh_for_a_copy_of_the_policy_is_refused(check):
  assert "config.rl.teacher.mesh places a teacher of fixed parameters" in check["policy_mesh_error"]
