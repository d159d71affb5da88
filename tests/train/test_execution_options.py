"""Execution options of config.model (unroll_layers) and the host allocator (parallel/host.py)."""

import os
import subprocess
import sys

import jax
import pytest
import rl_fixtures as fx

from posttrain_jax.methods import validate
from posttrain_jax.train import state as state_lib
from posttrain_jax.train.validate import ConfigError


@pytest.mark.parametrize(
  "value, layers, want",
  [
    ("auto", 2, jax.default_backend() == "cpu"),
    ("always", 2, True),
    ("never", 2, False),
    ("auto", 12, False),
  ],
)
def test_unroll_layers_resolves_per_backend_and_depth(value, layers, want):
  c = fx.smoke_config(1)
  c.model.unroll_layers = value
  c.model.overrides.num_layers = layers
  assert state_lib.model_config(c.model, 32).unroll_layers is want


@pytest.mark.parametrize(
  "value, want", [(-1, 64 if jax.default_backend() == "cpu" else 0), (0, 0), (32, 32)]
)
def test_causal_block_resolves_per_backend(value, want):
  c = fx.smoke_config(1)
  c.model.causal_block = value
  assert state_lib.model_config(c.model, 32).causal_block == want


def test_bad_execution_options_are_config_errors():
  c = fx.smoke_config(1)
  c.model.unroll_layers = "yes"
  with pytest.raises(
    ConfigError, match="model.unroll_layers='yes' is unknown; valid names: always, auto, never"
  ):
    validate(c)
  c = fx.smoke_config(1)
  c.model.causal_block = -2
  with pytest.raises(ConfigError, match="causal_block=-2"):
    validate(c)
  c = fx.smoke_config(1)
  with c.rl.ignore_type():  # a config file that builds its own rl section
    c.rl.shared_prefix = "auto"
  with pytest.raises(ConfigError, match="rl.shared_prefix must be True or False, got 'auto'"):
    validate(c)


_FAULTS = r"""
import resource, sys
import posttrain_jax  # tunes the allocator unless POSTTRAIN_JAX_MALLOC=system
import jax, jax.numpy as jnp
x = jnp.ones((4096, 2048))
f = jax.jit(lambda x: jnp.sum(jnp.sin(x) * jnp.cos(x) + jnp.tanh(x) @ x[:2048].T))
for _ in range(4):
  f(x).block_until_ready()
faults = []
for _ in range(8):
  r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  f(x).block_until_ready()
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)
print(min(faults))  # the steady state; a call now and then still grows the heap
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_tuned_allocator_stops_page_faulting_the_temporary_buffers():
  """A call with ~100 MB of temporaries: glibc's default maps and unmaps them every call
  (tens of thousands of page faults); tuned, warm calls reuse the pages."""

  def faults(mode):
    env = dict(os.environ, POSTTRAIN_JAX_MALLOC=mode, JAX_PLATFORMS="cpu")
    out = subprocess.run(
      [sys.executable, "-c", _FAULTS], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.split()[-1])

  tuned, system = faults(""), faults("system")
  # Fewest faults in one of 8 warm calls; seen: 0 vs ~22,000.
  assert system > 8000 and tuned < system / 10, (tuned, system)


_CPU = ["--xla_cpu_use_fusion_emitters=false", "--xla_cpu_enable_platform_dependent_math=false"]


def test_xla_flags_are_added_unless_the_user_set_them(monkeypatch):
  import platform

  from posttrain_jax.parallel import host

  monkeypatch.setattr(platform, "machine", lambda: "x86_64")
  both = host.xla_flags("", cpu_only=True).split()
  assert both == [*_CPU, "--xla_backend_optimization_level=1", "--xla_cpu_max_isa=AVX2"]
  # GPU / TPU backends read the optimisation level too: only the CPU backend's flags then.
  assert host.xla_flags("", cpu_only=False).split() == [*_CPU, "--xla_cpu_max_isa=AVX2"]
  kept = host.xla_flags(
    "--xla_backend_optimization_level=3 --xla_cpu_max_isa=AVX512 --foo=1", cpu_only=True
  ).split()
  assert kept == [
    "--xla_backend_optimization_level=3",
    "--xla_cpu_max_isa=AVX512",
    "--foo=1",
    *_CPU,
  ]
  # The ISA cap is an x86-64 flag: other machines get the rest.
  monkeypatch.setattr(platform, "machine", lambda: "aarch64")
  assert host.xla_flags("", cpu_only=True).split() == [*_CPU, "--xla_backend_optimization_level=1"]


def test_cpu_only_process_reads_jax_platforms(monkeypatch):
  from posttrain_jax.parallel import host

  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  assert host.cpu_only_process()
  monkeypatch.setenv("JAX_PLATFORMS", "cuda,cpu")
  assert not host.cpu_only_process()
  monkeypatch.delenv("JAX_PLATFORMS")
  monkeypatch.setattr(host, "_installed", lambda m: m == "jax_cuda12_plugin")
  assert not host.cpu_only_process()
  monkeypatch.setattr(host, "_installed", lambda m: False)
  assert host.cpu_only_process()


_FLAGS_IN_EFFECT = r"""
import os
import posttrain_jax, jax
jax.numpy.ones(3).block_until_ready()  # the backend has read XLA_FLAGS
print("FLAGS", os.environ.get("XLA_FLAGS", ""))
"""


@pytest.mark.parametrize("opt_out", [False, True])
def test_import_sets_the_flags_before_the_backend_starts(opt_out):
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  env["JAX_PLATFORMS"] = "cpu"
  if opt_out:
    env["POSTTRAIN_JAX_XLA_FLAGS"] = "system"
  out = subprocess.run(
    [sys.executable, "-c", _FLAGS_IN_EFFECT], env=env, capture_output=True, text=True, timeout=300
  )
  assert out.returncode == 0, out.stderr[-2000:]
  flags = out.stdout.split("FLAGS", 1)[1].split()
  if opt_out:
    assert flags == []
  else:
    from posttrain_jax.parallel import host

    want = host.xla_flags("", cpu_only=True).split()
    assert flags == want and "--xla_cpu_enable_platform_dependent_math=false" in flags


def test_importing_after_the_backend_started_warns_that_the_flags_do_not_apply():
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  env["JAX_PLATFORMS"] = "cpu"
  late = "import jax\njax.numpy.ones(3).block_until_ready()\nimport posttrain_jax\n"
  out = subprocess.run(
    [sys.executable, "-W", "always", "-c", late],
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert "JAX started its backend before `import posttrain_jax`" in out.stderr
  assert "--xla_cpu_use_fusion_emitters=false" in out.stderr
  early = "import posttrain_jax\nimport jax\njax.numpy.ones(3).block_until_ready()\n"
  out = subprocess.run(
    [sys.executable, "-W", "always", "-c", early],
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0 and "backend before" not in out.stderr, out.stderr[-2000:]


def test_freeze_imports_moves_the_imported_objects_out_of_the_collector():
  code = (
    "import gc\nfrom posttrain_jax.parallel import host\nbefore = gc.get_freeze_count()\n"
    "host.freeze_imports()\nprint(before, gc.get_freeze_count())"
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  before, after = map(int, out.stdout.split())
  assert before == 0 and after > 10000  # jax alone holds ~10^5 objects
