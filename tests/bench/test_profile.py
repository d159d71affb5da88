"""The per-op profile (bench/profile.py, scripts/profile_step.py): parsing, grouping, and the
script on a reduced workload (no timing asserted)."""

import gzip
import json
import os
import subprocess
import sys

import pytest

from posttrain_jax.bench import profile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

HLO = """
%fused_computation.3 (param_0: f32[64,512]) -> f32[64,4096] {
  %param_0 = f32[64,512]{1,0} parameter(0)
}
ENTRY %main {
  %ynn_fusion.3 = f32[64,4096]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused_computation.3, metadata={op_name="jit(generate)/while/body/dot_general" stack_frame_id=1}, backend_config={"outer_dimension_partitions":[],"fusion_config":{"kind":"__ynn_fusion"}}
  %ynn_fusion.7 = f32[64,4096]{1,0} fusion(%c, %d), kind=kCustom, calls=%fused_computation.7, metadata={op_name="jit(generate)/while/body/dot_general" stack_frame_id=2}, backend_config={"fusion_config":{"kind":"__ynn_fusion"}}
  %copy.1 = u32[] copy(%e)
  ROOT %dot.2 = f32[512,512]{1,0} dot(%f, %g), lhs_contracting_dims={0}, rhs_contracting_dims={0}, metadata={op_name="jit(constrained)/transpose(jvp())/dot_general"}
}
"""


def test_parse_hlo_reads_shape_opcode_source_and_library():
  ops = profile.parse_hlo(HLO)
  assert ops["ynn_fusion.3"] == profile.HloOp(
    "f32[64,4096]{1,0}", "fusion", "dot_general", "__ynn_fusion"
  )
  assert ops["dot.2"] == profile.HloOp("f32[512,512]{1,0}", "dot", "dot_general", "")
  assert ops["copy.1"].opcode == "copy" and ops["copy.1"].source == ""
  assert ops["param_0"].opcode == "parameter"


def test_group_sums_thunks_of_one_kind_and_skips_other_events():
  ops = profile.parse_hlo(HLO)
  durations = {
    "ynn_fusion.3": 3000.0,
    "ynn_fusion.7": 1000.0,
    "dot.2": 1000.0,
    "ThunkExecutor::Execute": 9e9,
  }
  calls = {"ynn_fusion.3": 3, "ynn_fusion.7": 1, "dot.2": 2, "ThunkExecutor::Execute": 1}
  rows = profile.group(durations, calls, ops)
  assert [(r["op"], r["ms"], r["calls"]) for r in rows] == [("fusion", 4.0, 4), ("dot", 1.0, 2)]
  assert rows[0]["share"] == pytest.approx(0.8) and rows[0]["library"] == "__ynn_fusion"
  text = profile.format_rows(rows, top=1)
  assert "ynn_fusion" in text and "f32[64,4096]" in text and "dot.2" not in text


def test_thunk_events_and_missing_inputs(tmp_path):
  trace = tmp_path / "trace" / "plugins" / "profile" / "run"
  trace.mkdir(parents=True)
  events = [
    {"ph": "X", "name": "ynn_fusion.3", "dur": 5.0},
    {"ph": "X", "name": "ynn_fusion.3", "dur": 7.0},
    {"ph": "i", "name": "marker"},
  ]
  with gzip.open(trace / "host.trace.json.gz", "wt") as f:
    json.dump({"traceEvents": events}, f)
  assert profile.thunk_events(str(tmp_path / "trace")) == (
    {"ynn_fusion.3": 12.0},
    {"ynn_fusion.3": 2},
  )
  with pytest.raises(FileNotFoundError, match="create_perfetto_trace"):
    profile.thunk_events(str(tmp_path / "empty"))
  with pytest.raises(FileNotFoundError, match="xla_dump_to"):
    profile.find_module(str(tmp_path), "generate")


@pytest.mark.parametrize("stage,expect", [("sample", "dot_general"), ("update", "dot")])
def test_profile_script_smoke(tmp_path, stage, expect):
  proc = subprocess.run(
    [
      sys.executable,
      "scripts/profile_step.py",
      "--workload",
      "tiny",
      "--preset",
      "nano",
      "--stage",
      stage,
      "--max_new",
      "4",
      "--group",
      "2",
      "--prompts",
      "2",
      "--json",
      "--out",
      str(tmp_path),
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  record = json.loads(proc.stdout.strip().splitlines()[-1])
  assert record["stage"] == stage and record["wall_s"] > 0 and record["rows"]
  assert any(expect in (r["source"] + r["op"]) for r in record["rows"])
  assert abs(sum(r["share"] for r in record["rows"]) - 1.0) < 1e-6
