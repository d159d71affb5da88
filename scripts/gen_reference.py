#!/usr/bin/env python
"""Writes docs/reference.md (posttrain_jax/docgen.py); --check exits 1 when it is out of date."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from posttrain_jax import docgen  # noqa: E402

if __name__ == "__main__":
  sys.exit(docgen.main())
