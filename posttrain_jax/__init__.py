"""posttrain_jax: JAX-native RL post-training of language models.

Layers (bottom to top, see DESIGN.md section 1): objectives, io, parallel -> models -> rollout
-> envs -> train -> main. Import the subpackage you need, e.g. ``from posttrain_jax import objectives``.
"""

__version__ = "0.1.0"

# XLA:CPU frees each call's temporary buffer and glibc unmaps it; keep it for the next call
# (parallel/host.py; ~20% of a CPU train step). Opt out with POSTTRAIN_JAX_MALLOC=system.
# XLA:CPU compiler flags (faster kernels and compiles; before JAX creates a backend). Opt out
# with POSTTRAIN_JAX_XLA_FLAGS=system.
from posttrain_jax.parallel import host as _host  # noqa: E402

_host.tune_host_allocator()
_host.tune_xla_flags()
