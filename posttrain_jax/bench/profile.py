"""Where one compiled call spends its time, op by op (scripts/profile_step.py; issue 5).

XLA:CPU emits one profiler event per executed thunk (a fusion, a library dot, a copy ...) when
``--xla_cpu_enable_xprof_traceme=true`` is in ``XLA_FLAGS``; ``jax.profiler`` writes them to a
Perfetto trace. This module sums those events by thunk name, looks every name up in the
optimised HLO that ``--xla_dump_to`` wrote (its output shape, opcode and the JAX op it came
from) and groups thunks that share all three, so the 8 layers x 128 decode steps of one
projection come out as one row.

Thunks may run concurrently (XLA:CPU starts independent thunks in parallel, and library dots
run asynchronously), so the rows can sum to more than the call's wall time; read them as
shares, and compare shapes with their FLOPs to find the slow ones.
"""

import collections
import glob
import gzip
import json
import os
import re
from typing import NamedTuple

_DEF = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(\S+)\s+([\w\-]+)\(")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


class HloOp(NamedTuple):
  shape: str  # e.g. f32[64,4096]{1,0}
  opcode: str  # fusion, dot, copy, ...
  source: str  # the last component of the JAX op name (dot_general, reduce_sum, ...)
  library: str  # the fusion's library kind (e.g. __ynn_fusion), or ""


def parse_hlo(text: str) -> dict[str, HloOp]:
  """``{instruction name: HloOp}`` of every instruction defined in HLO ``text``."""
  ops = {}
  for line in text.splitlines():
    m = _DEF.match(line)
    if not m:
      continue
    name, shape, opcode = m.groups()
    source = _OP_NAME.search(line)
    library = re.search(r'"kind":"(__\w+)"', line)
    ops[name] = HloOp(
      shape,
      opcode,
      source.group(1).split("/")[-1] if source else "",
      library.group(1) if library else "",
    )
  return ops


def thunk_events(trace_dir: str) -> tuple[dict[str, float], dict[str, int]]:
  """``(microseconds, calls)`` per event name of the Perfetto trace under ``trace_dir``."""
  paths = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
  if not paths:
    raise FileNotFoundError(
      f"no *.trace.json.gz under {trace_dir}: was the trace written "
      "with jax.profiler.start_trace(..., create_perfetto_trace=True)?"
    )
  with gzip.open(max(paths, key=os.path.getmtime)) as f:
    events = json.load(f)["traceEvents"]
  dur, calls = collections.Counter(), collections.Counter()
  for e in events:
    if e.get("ph") == "X":
      dur[e["name"]] += e.get("dur", 0.0)
      calls[e["name"]] += 1
  return dict(dur), dict(calls)


def group(durations: dict[str, float], calls: dict[str, int], ops: dict[str, HloOp]) -> list[dict]:
  """Rows ``{op, shape, source, library, ms, calls, share}`` for the events that are thunks of
  ``ops`` (others, such as the executor's own spans, are left out), grouped by (opcode, shape,
  source, library), largest first; ``share`` is of the grouped total."""
  rows = collections.defaultdict(lambda: [0.0, 0])
  for name, us in durations.items():
    op = ops.get(name)
    if op is None:
      continue
    key = (op.opcode, op.shape, op.source, op.library)
    rows[key][0] += us / 1e3
    rows[key][1] += calls.get(name, 0)
  total = sum(ms for ms, _ in rows.values()) or 1.0
  out = [
    dict(op=k[0], shape=k[1], source=k[2], library=k[3], ms=ms, calls=n, share=ms / total)
    for k, (ms, n) in rows.items()
  ]
  return sorted(out, key=lambda r: -r["ms"])


def find_module(dump_dir: str, jit_name: str) -> str:
  """The optimised HLO text of the largest module named ``jit_<jit_name>`` in ``dump_dir``."""
  paths = glob.glob(os.path.join(dump_dir, f"*jit_{jit_name}*after_optimizations.txt"))
  if not paths:
    raise FileNotFoundError(
      f"no optimised HLO of jit_{jit_name} in {dump_dir}: was "
      "--xla_dump_to in XLA_FLAGS before JAX compiled it?"
    )
  return max(paths, key=os.path.getsize)


def format_rows(rows: list[dict], top: int) -> str:
  lines = [f"{'ms':>9} {'share':>6} {'calls':>6}  op / output shape / from"]
  for r in rows[:top]:
    kind = r["op"] + (f" ({r['library'].strip('_')})" if r["library"] else "")
    lines.append(
      f"{r['ms']:9.1f} {r['share']:6.1%} {r['calls']:6d}  {kind} {r['shape']} {r['source']}"
    )
  return "\n".join(lines)
