"""Host memory allocator settings for XLA:CPU (glibc ``mallopt``).

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
"""

import ctypes
import ctypes.util
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
  ok = all(mallopt(param, value) == 1 for param, value in (
      (_M_ARENA_MAX, 1),                 # one arena: XLA's threads share the reused heap
      (_M_MMAP_MAX, 0),                  # no mmap per large block (no munmap, no page faults)
      (_M_TRIM_THRESHOLD, -1),           # never give the heap top back (-1: SIZE_MAX in glibc)
      (_M_TOP_PAD, top_pad_mb << 20)))
  _state["applied"] = ok
  return ok
