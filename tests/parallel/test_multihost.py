"""Two local processes (gloo CPU collectives, coordinator on 127.0.0.1, 2 fake CPU devices each)
run 2 RL steps of the smoke config on one (2, 2, 1) mesh (multihost_check.py): both end with
identical parameters, each built and scored its own rows, only process 0 wrote metrics, and
the checkpoints both saved restore on one device to the same parameters."""

import json
import os
import socket
import subprocess
import sys

import mesh_fixtures
import numpy as np

from posttrain_jax import io as ptio


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(workdir, nproc: int = 2) -> list:
  script = os.path.join(os.path.dirname(__file__), "multihost_check.py")
  coordinator = f"127.0.0.1:{_free_port()}"
  procs = [
    subprocess.Popen(
      [sys.executable, script, str(i), str(nproc), coordinator, str(workdir)],
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      env=mesh_fixtures.env(),
    )
    for i in range(nproc)
  ]
  outputs = []
  try:
    for p in procs:
      outputs.append(p.communicate(timeout=300)[0])
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-4000:]
  return outputs


def _flatten(tree, prefix=""):
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f"{prefix}{k}/"))
    else:
      out[f"{prefix}{k}"] = np.asarray(v)
  return out


def test_two_processes_train_identical_replicas_and_restore(tmp_path):
  _launch(tmp_path)
  info = [json.loads((tmp_path / f"info_p{i}.json").read_text()) for i in range(2)]
  assert [i["process"] for i in info] == [0, 1]
  assert all(i["processes"] == 2 and i["devices"] == 4 and i["local_devices"] == 2 for i in info)
  assert [i["rows"] for i in info] == [[0, 8], [8, 16]]  # each process's share of 4 x 4 rows
  p0, p1 = (np.load(tmp_path / f"params_p{i}.npz") for i in range(2))
  assert sorted(p0.files) == sorted(p1.files) and len(p0.files) == 22
  for name in p0.files:  # the data-parallel replicas agree exactly
    np.testing.assert_array_equal(p0[name], p1[name], err_msg=name)
  moved = [
    n
    for n in p0.files
    if n.startswith("final/") and not np.array_equal(p0[n], p0[n.replace("final/", "init/")])
  ]
  assert moved, "the two RL updates changed no parameter"
  # Metrics: one writer (process 0), one record per step.
  records = ptio.read_jsonl(str(tmp_path / "rl" / "metrics.jsonl"))
  assert [r["step"] for r in records] == [1, 2]
  assert all(r["sampler/weight_version"] == i for i, r in enumerate(records))
  assert all(r["sampler/resynced"] == 1.0 for r in records)  # fsdp=2: a resharded copy
  # Both checkpoints (the final parameters and the step-2 run state) restore on one device.
  final = _flatten(ptio.checkpoint.restore_params_single_device(str(tmp_path / "rl" / "final")))
  state = _flatten(
    ptio.checkpoint.restore_params_single_device(str(tmp_path / "rl" / "checkpoints"))
  )
  assert (
    sorted(final)
    == sorted(state)
    == sorted(n[len("final/") :] for n in p0.files if n.startswith("final/"))
  )
  for name, value in final.items():
    np.testing.assert_array_equal(value, p0[f"final/{name}"], err_msg=name)
    np.testing.assert_array_equal(state[name], value, err_msg=name)
