#!/usr/bin/env python
"""Export a run's stage or a Hugging Face folder as a Hugging Face folder: SRC OUT
(posttrain_jax/train/export_hf.py)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from posttrain_jax.train import export_hf  # noqa: E402

if __name__ == "__main__":
  sys.exit(export_hf.main())
