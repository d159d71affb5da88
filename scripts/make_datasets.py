#!/usr/bin/env python
"""(Re)generates the small static datasets committed under experiments/data/.

  python scripts/make_datasets.py            # rewrites every dataset (identical bytes)
  python scripts/make_datasets.py --check    # exit 1 if a committed file differs

experiments/data/addition_l3_train256.jsonl: 256 train-split problems of env ``arithmetic`` at
level 3 (3-digit addition), drawn with the fixed key ``jax.random.key(2606)``. The finite prompt
pool that experiments/cero.py and experiments/review.py train on in epochs (config.env.dataset);
eval problems still come from the env's eval split. experiments/data/lara_*.jsonl: LaRA's item
sets (experiments/lara.py; ``LARA`` below). Deterministic: the draw depends only on the
key and the file is written with sorted keys, one problem a line.
"""

import argparse
import os
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

import jax  # noqa: E402  pylint: disable=wrong-import-position

from posttrain_jax.envs import catalogue, static  # noqa: E402  pylint: disable=wrong-import-position

DATA_DIR = os.path.join(ROOT, "experiments", "data")
# file name -> (env, level, key seed, number of problems)
DATASETS = {
  "addition_l3_train256.jsonl": ("arithmetic", 3, 2606, 256),
}
# LaRA's item sets (experiments/lara.py): 500 eval-split problems of arithmetic level 3 (key
# 2611), split into 200 the RL run trains on, 200 it never sees and 100 clean references; the RL
# training file holds the 200 seen items (marked train) and 200 train-split problems (key 2612);
# the clean control's file holds 400 train-split problems (the same 200 first).
LARA = ("arithmetic", 3, 2611, 2612)


def write(path: str, env: str, level: int, seed: int, n: int) -> None:
  static.write_dataset(path, env, jax.random.key(seed), n, level=level, split="train")


def write_lara(folder: str) -> list[str]:
  """LaRA's four files in ``folder``; returns their names."""
  env, level, eval_seed, train_seed = LARA
  task = catalogue.ENVS[env]
  items = task.sample(jax.random.key(eval_seed), 500, level=level, split="eval")
  train = task.sample(jax.random.key(train_seed), 400, level=level, split="train")
  files = {
    "lara_seen.jsonl": (items[:200], "eval"),
    "lara_unseen.jsonl": (items[200:400], "eval"),
    "lara_reference.jsonl": (items[400:], "eval"),
  }
  for name, (problems, split) in files.items():
    static.write_jsonl(os.path.join(folder, name), problems, split=split)
  static.write_jsonl(
    os.path.join(folder, "lara_train.jsonl"), items[:200] + train[:200], split="train"
  )
  static.write_jsonl(os.path.join(folder, "lara_train_clean.jsonl"), train, split="train")
  return [*files, "lara_train.jsonl", "lara_train_clean.jsonl"]


def _read(path: str) -> bytes:
  with open(path, "rb") as f:
    return f.read()


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--check", action="store_true", help="compare with the files on disk instead of writing them"
  )
  args = parser.parse_args()
  status = 0
  with tempfile.TemporaryDirectory() as tmp:  # LaRA's files: written, or compared
    names = write_lara(tmp if args.check else DATA_DIR)
    for name in names:
      path = os.path.join(DATA_DIR, name)
      if args.check:
        same = os.path.exists(path) and _read(path) == _read(os.path.join(tmp, name))
        print(f"{'ok' if same else 'DIFFERS'}: {os.path.relpath(path, ROOT)}")
        status |= 0 if same else 1
      else:
        print(f"wrote {os.path.relpath(path, ROOT)} (LaRA items)")
  for name, (env, level, seed, n) in DATASETS.items():
    path = os.path.join(DATA_DIR, name)
    if args.check:
      with tempfile.TemporaryDirectory() as tmp:
        fresh = os.path.join(tmp, name)
        write(fresh, env, level, seed, n)
        same = os.path.exists(path) and _read(path) == _read(fresh)
      print(f"{'ok' if same else 'DIFFERS'}: {os.path.relpath(path, ROOT)}")
      status |= 0 if same else 1
    else:
      write(path, env, level, seed, n)
      print(f"wrote {os.path.relpath(path, ROOT)} ({n} problems, {env} level {level}, key {seed})")
  return status


if __name__ == "__main__":
  sys.exit(main())
