"""A run's numbers do not depend on the machine's cores or instruction set (parallel/host.py).

Each case runs tests/parallel/determinism_check.py in a fresh process (XLA reads its flags and
sizes its thread pool when the backend starts) and compares the hashes of one gradient of the
tiny preset and its greedy tokens. The controls show that the setting under test matters on
this machine: without it the bits change.
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def _run(threads: int, *, xla_flags: str = "", core=None) -> dict:
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "POSTTRAIN_JAX_XLA_FLAGS")}
  if xla_flags:
    env["XLA_FLAGS"] = xla_flags  # the library adds its own flags unless these set them
  args = [str(threads)] + ([str(core)] if core is not None else [])
  proc = subprocess.run(
    [sys.executable, os.path.join(HERE, "determinism_check.py"), *args],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(len(CORES) < 2, reason="needs two cores to compare with one")
def test_one_compute_thread_gives_the_same_bits_on_any_number_of_cores():
  on_all = _run(1)
  on_one = _run(-1, core=CORES[0])  # a one-core machine: JAX's pool has one thread anyway
  assert on_all["threads"] == 1 and on_one["threads"] is None
  assert on_all == {**on_one, "threads": 1}
  # Control: a pool of one thread per core splits the weight gradients' sum differently.
  per_core = _run(0)
  assert per_core["grads"] != on_all["grads"]


def _has_avx512() -> bool:
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      return " avx512f" in f.read()
  except OSError:
    return False


@pytest.mark.skipif(not _has_avx512(), reason="needs a CPU with AVX-512 to compare with AVX2")
def test_avx2_and_avx512_give_the_same_bits_under_the_librarys_flags():
  # What an AVX2-only CPU (e.g. an AMD EPYC before Zen 4) compiles against what this one does.
  avx2 = _run(1, xla_flags="--xla_cpu_max_isa=AVX2")
  avx512 = _run(1, xla_flags="--xla_cpu_max_isa=AVX512")
  assert avx2 == avx512
  # Control: with platform-dependent math on and the library kernels off, XLA's own code for
  # the two instruction sets gives other bits.
  loose = "--xla_cpu_enable_platform_dependent_math=true --xla_cpu_experimental_ynn_fusion_type="
  assert (
    _run(1, xla_flags=f"{loose} --xla_cpu_max_isa=AVX2")["grads"]
    != _run(1, xla_flags=f"{loose} --xla_cpu_max_isa=AVX512")["grads"]
  )
