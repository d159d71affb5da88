#!/usr/bin/env python
"""(Re)generates the static arm's dataset of experiments/tron.py under experiments/data/.

  python scripts/make_tron_dataset.py            # rewrites the dataset (same problems)
  python scripts/make_tron_dataset.py --check    # exit 1 if the committed dataset differs

experiments/data/tron_static/: a TFDS dataset (array_record, envs/tfds_data.py) of 512
train-split problems of the online mix ``tron:no_logic`` (every suite task but the logic
bucket, drawn with equal weight) at level 2 (clipped per task), drawn with the fixed key
``jax.random.key(1599)``. It is TRON's static baseline (arXiv 2606.01599): a finite prompt pool
that the ``static`` arm trains on in epochs (config.env.dataset) while the online arms draw fresh
problems. Deterministic: the draw depends only on the key; ``--check`` compares the problems
read back (prompt, answer, env, level, uid, data, split) with a fresh draw.
"""

import argparse
import os
import shutil
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

import jax  # noqa: E402  pylint: disable=wrong-import-position

from posttrain_jax.envs import static  # noqa: E402  pylint: disable=wrong-import-position

OUT_DIR = os.path.join(ROOT, "experiments", "data", "tron_static")
ENV, LEVEL, SEED, N = "tron:no_logic", 2, 1599, 512


def write(out_dir: str) -> list:
  if os.path.isdir(out_dir):
    shutil.rmtree(out_dir)
  return static.write_tfds_dataset(
    out_dir, ENV, jax.random.key(SEED), N, level=LEVEL, split="train"
  )


def records(path: str) -> list[tuple]:
  ds = static.StaticDataset(path)
  return [
    (p.prompt, p.answer, p.env, p.level, p.uid, p.data, s) for p, s in zip(ds.problems, ds.splits)
  ]


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--check", action="store_true", help="compare with the dataset on disk instead of writing it"
  )
  args = parser.parse_args()
  rel = os.path.relpath(OUT_DIR, ROOT)
  if args.check:
    with tempfile.TemporaryDirectory() as tmp:
      fresh = os.path.join(tmp, "tron_static")
      write(fresh)
      same = os.path.isdir(OUT_DIR) and records(fresh) == records(OUT_DIR)
    print(f"{'ok' if same else 'DIFFERS'}: {rel}")
    return 0 if same else 1
  problems = write(OUT_DIR)
  envs = sorted({p.env for p in problems})
  size = sum(os.path.getsize(os.path.join(OUT_DIR, f)) for f in os.listdir(OUT_DIR))
  print(
    f"wrote {rel} ({len(problems)} problems from {len(envs)} tasks of {ENV} at level "
    f"{LEVEL}, key {SEED}; {size} bytes)"
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
