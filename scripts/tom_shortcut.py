#!/usr/bin/env python
"""The last-mention shortcut beside a ToM reproduction's runs (posttrain_jax/sweeps/tom_shortcut.py)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from posttrain_jax.sweeps import tom_shortcut  # noqa: E402

if __name__ == "__main__":
  sys.exit(tom_shortcut.main())
