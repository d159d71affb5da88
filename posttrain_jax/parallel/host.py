"""Host settings for XLA:CPU: the memory allocator (glibc ``mallopt``) and compiler flags.

XLA:CPU allocates each execution's temporary buffer (tens to hundreds of MB for a train step:
the activations kept for the backward pass) with ``malloc`` and frees it when the call returns.
glibc serves any allocation above 32 MB with a fresh ``mmap`` and returns it with ``munmap``, so
every call page-faults its whole temporary buffer back in and the kernel zeroes it: on this
project's tiny GRPO train step that was ~29,000 page faults and ~60 ms of system time per
117 MB step, a fifth of the step (measured with ``resource.getrusage``; see results/bench.md).

:func:`tune_host_allocator` keeps freed memory in the process: one malloc arena, no ``mmap``
for large blocks, no trimming of the heap top. The next call reuses the same pages. Memory the
process once used is then not returned to the operating system until it exits (its peak RSS
stays resident), which is the trade a training process wants. Other allocators that cache large
blocks (tcmalloc: ``LD_PRELOAD=libtcmalloc_minimal.so.4``) have the same effect.

Set ``POSTTRAIN_JAX_MALLOC=system`` to leave glibc's defaults alone. Has no effect (and returns
False) off glibc.

:func:`tune_xla_flags` adds XLA:CPU compiler flags to ``XLA_FLAGS`` (see ``CPU_FLAGS``); set
``POSTTRAIN_JAX_XLA_FLAGS=system`` to leave ``XLA_FLAGS`` alone. :func:`freeze_imports` keeps
the garbage collector off the imported modules' objects (entry points call it).

Reproducibility (docs/reproducibility.md). Three things make XLA:CPU's numbers depend on the
machine rather than on the program, each measured on this project's pretraining (40 steps of
the tiny preset: which per-step losses and gradient norms changed in their last bits):

- the CPU's instruction set: XLA compiles its kernels for the host's features (AVX-512 here)
  and the YNNPACK library that computes its dots picks kernels at run time. ``CPU_FLAGS`` turn
  off platform-dependent math (YNNPACK's consistent-arithmetic mode, no host-specific math
  shortcuts) and cap the generated code at AVX2 on x86-64: AVX2 and AVX-512 then give the
  same bits; an AVX-only CPU (no FMA, before 2013) still differs.
- the number of threads a computation is split over: Eigen splits a large matmul's sum (the
  weight gradients' contraction over tokens) between the threads of XLA's pool, which has
  one thread per core the process may use. :func:`set_cpu_threads` sizes the pool
  (``config.cpu_threads``, default 2, so a 2-core laptop and a 64-core server add in the
  same order; 1 for a 1-core machine too) and leaves the process free to use every core for
  everything else.
- the libraries' versions: requirements.lock (``make reproduce-env``).
"""

import ctypes
import ctypes.util
import importlib.util
import os

# glibc <malloc.h> parameter numbers.
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8

ENV = "POSTTRAIN_JAX_MALLOC"
_state = {"applied": False}


def tune_host_allocator(top_pad_mb: int = 256) -> bool:
  """Makes glibc keep and reuse large freed blocks (see the module docstring).

  Call it early, before JAX starts its threads (the entry points do); calling it again is a
  no-op. ``top_pad_mb``: extra heap grown at each ``sbrk``, so a growing buffer does not grow
  the heap a page at a time. Returns whether the settings are in effect.
  """
  if _state["applied"]:
    return True
  if os.environ.get(ENV, "").lower() == "system":
    return False
  libc_name = ctypes.util.find_library("c")
  if libc_name is None:
    return False
  try:
    libc = ctypes.CDLL(libc_name)
    mallopt = libc.mallopt
    libc.gnu_get_libc_version  # glibc only: another libc's mallopt numbers differ
  except (OSError, AttributeError):
    return False
  mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
  ok = all(
    mallopt(param, value) == 1
    for param, value in (
      (_M_ARENA_MAX, 1),  # one arena: XLA's threads share the reused heap
      (_M_MMAP_MAX, 0),  # no mmap per large block (no munmap, no page faults)
      (_M_TRIM_THRESHOLD, -1),  # never give the heap top back (-1: SIZE_MAX in glibc)
      (_M_TOP_PAD, top_pad_mb << 20),
    )
  )
  _state["applied"] = ok
  return ok


XLA_ENV = "POSTTRAIN_JAX_XLA_FLAGS"
# XLA:CPU's legacy (LLVM IR) fusion emitters instead of the MLIR fusion emitters: faster
# iterations and less compile time (measured in docs/performance.md, "XLA:CPU flags"). Read by
# the CPU backend only.
# Platform-dependent math off and AVX2 as the widest instruction set (x86-64 only; see the
# module docstring): the same bits on every CPU with AVX2 and FMA.
CPU_FLAGS = {
  "xla_cpu_use_fusion_emitters": "false",
  "xla_cpu_enable_platform_dependent_math": "false",
}
X86_FLAGS = {"xla_cpu_max_isa": "AVX2"}
_X86 = ("x86_64", "amd64", "i686", "i386")
# LLVM -O1 for the generated kernels: less compile time, no slower iterations
# (docs/performance.md, "XLA:CPU flags"). GPU backends read this flag too, so it is set only when
# JAX can run on the CPU alone (JAX_PLATFORMS=cpu, or no accelerator plugin installed).
CPU_ONLY_PROCESS_FLAGS = {"xla_backend_optimization_level": "1"}
_ACCELERATOR_MODULES = (
  "jax_cuda12_plugin",
  "jax_cuda13_plugin",
  "jax_rocm60_plugin",
  "jax_rocm7_plugin",
  "libtpu",
  "jax_plugins.xla_cuda12",
  "jax_plugins.xla_cuda13",
  "jax_plugins.xla_rocm7",
)


def _installed(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except (ImportError, ValueError):
    return False


def cpu_only_process() -> bool:
  """Whether JAX in this process can only run on the CPU: ``JAX_PLATFORMS`` says so, or it is
  unset and no GPU / TPU plugin is installed."""
  platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
  if platforms:
    return platforms == "cpu"
  return not any(_installed(m) for m in _ACCELERATOR_MODULES)


def xla_flags(existing: str, cpu_only: bool) -> str:
  """``existing`` XLA_FLAGS plus our flags, each unless ``existing`` already sets it."""
  import platform

  flags = dict(CPU_FLAGS, **(CPU_ONLY_PROCESS_FLAGS if cpu_only else {}))
  if platform.machine().lower() in _X86:
    flags.update(X86_FLAGS)
  given = {f.split("=", 1)[0].lstrip("-") for f in existing.split()}
  extra = [f"--{k}={v}" for k, v in flags.items() if k not in given]
  return " ".join([existing.strip()] + extra if existing.strip() else extra)


def tune_xla_flags() -> str:
  """Adds our XLA:CPU flags to the ``XLA_FLAGS`` environment variable (a flag the user set
  keeps the user's value) and returns it. XLA reads it when JAX creates its first backend, so
  call this before any computation (``import posttrain_jax`` does)."""
  if os.environ.get(XLA_ENV, "").lower() == "system":
    return os.environ.get("XLA_FLAGS", "")
  before = os.environ.get("XLA_FLAGS", "")
  os.environ["XLA_FLAGS"] = xla_flags(before, cpu_only_process())
  if os.environ["XLA_FLAGS"] != before and backend_started():
    import warnings

    warnings.warn(
      "posttrain_jax: JAX started its backend before `import posttrain_jax`, so the XLA:CPU "
      f"flags it sets ({os.environ['XLA_FLAGS'][len(before) :].strip()}) do not apply in this "
      "process (about 20% slower on CPU); import posttrain_jax before running any JAX "
      "computation, or put the flags in XLA_FLAGS yourself",
      stacklevel=2,
    )
  return os.environ["XLA_FLAGS"]


def backend_started() -> bool:
  """Whether JAX has already created a backend in this process (it then read XLA_FLAGS)."""
  import sys

  bridge = sys.modules.get("jax._src.xla_bridge")
  return bool(getattr(bridge, "_backends", None))


def freeze_imports() -> None:
  """Moves every object alive now (the imported modules of jax, flax, transformers...) out of
  the garbage collector's generations (``gc.freeze``), so the collections that tracing and
  compiling trigger stop rescanning them. Entry points call it once after their imports: a
  warm-cache RL start-up took ~1 s less (tiny: setup 4.1 -> 3.0 s, first step 2.2 -> 1.9 s)."""
  import gc

  gc.collect()
  gc.freeze()


def set_cpu_devices(count: int) -> None:
  """Splits the host into ``count`` XLA:CPU devices (``jax_num_cpu_devices``); 0 leaves JAX's
  setting alone. JAX reads it when its backend starts, so this must run before any JAX
  computation; afterwards it only checks that the CPU backend has ``count`` devices.

  Several CPU devices let a small model's sampler decode row shards concurrently, one thread
  each, on its own mesh (``config.sampler_mesh``): a decode step's matmuls are too small for
  two threads to share one (see README "What made it faster"). ValueError if the backend
  already runs with another count.
  """
  count = int(count or 0)
  if count <= 0:
    return
  import jax

  if not backend_started():
    jax.config.update("jax_num_cpu_devices", count)
    return
  have = len(jax.devices("cpu"))
  if have != count:
    raise ValueError(
      f"cpu_devices={count}, but JAX's CPU backend already started with {have} device(s); "
      "set it before any JAX computation (posttrain_jax.main does, from the config), or "
      f"call jax.config.update('jax_num_cpu_devices', {count}) at the top of your script"
    )


_threads = {"set": None}


def set_cpu_threads(count: int) -> int | None:
  """Sizes XLA:CPU's pool of compute threads to ``count`` (0: one per core, JAX's default) and
  returns the size set (at most the cores this process may use), or None when it could not be set (JAX's backend already started; the
  pool then has one thread per core this process could use at that time).

  XLA sizes the pool by the cores the process may run on when the backend starts. This starts
  the backend with the calling thread restricted to ``count`` cores, then gives every thread
  of the process all its cores back: the pool keeps ``count`` threads, the OS runs them (and
  everything else) on any core. Must run before any JAX computation (entry points call it,
  after :func:`set_cpu_devices`). Linux only; elsewhere returns None.
  """
  count = int(count or 0)
  if _threads["set"] is not None:
    return _threads["set"]
  if count <= 0 or backend_started() or not hasattr(os, "sched_setaffinity"):
    return None
  allowed = os.sched_getaffinity(0)
  import jax

  if count < len(allowed):
    os.sched_setaffinity(0, sorted(allowed)[:count])
  try:
    jax.devices()  # starts the backends: the CPU client sizes its pools now
  finally:
    if count < len(allowed):
      for tid in os.listdir("/proc/self/task"):
        try:
          os.sched_setaffinity(int(tid), allowed)
        except OSError:  # a thread that exited meanwhile
          pass
  _threads["set"] = min(count, len(allowed))
  return _threads["set"]


def cpu_threads() -> int | None:
  """The size :func:`set_cpu_threads` gave XLA:CPU's compute pool in this process (None: not
  set, one thread per core)."""
  return _threads["set"]
