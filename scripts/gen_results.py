#!/usr/bin/env python
"""Writes the results tables of README.md and docs/experiments.md from results/ (the files each
table was computed from); --check exits 1 when they are out of date."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from posttrain_jax.sweeps import index  # noqa: E402

if __name__ == "__main__":
  sys.exit(index.main())
