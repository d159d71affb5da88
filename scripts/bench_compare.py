#!/usr/bin/env python
"""Ours against TRL and tunix on the same GRPO workloads: results/bench.md (posttrain_jax/bench/compare.py)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from posttrain_jax.bench import compare  # noqa: E402

if __name__ == "__main__":
  sys.exit(compare.main())
