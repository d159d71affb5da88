"""envs.tfds_data: the static dataset as a TFDS dataset in array_record format (no TensorFlow)."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from posttrain_jax import envs
from posttrain_jax.envs import static, tfds_data


def _write_user_dataset(out_dir, features, splits, name="my_ds"):
  """A user's own TFDS dataset (array_record) with the given features and split -> examples."""
  os.makedirs(out_dir, exist_ok=True)
  identity = tfds.core.DatasetIdentity(
    name=name, version=tfds.core.Version("1.0.0"), data_dir=out_dir, module_name=__name__
  )
  info = tfds.core.DatasetInfo(builder=identity, features=tfds.features.FeaturesDict(features))
  writer = tfds.core.SequentialWriter(info, max_examples_per_shard=4, file_format="array_record")
  writer.initialize_splits(list(splits))
  writer.add_examples(splits)
  writer.close_all()
  return out_dir


@pytest.mark.parametrize("name,level", [("tron/sub", 3), ("countdown", 3), ("tron", 4)])
def test_tfds_and_jsonl_round_trips_agree(tmp_path, name, level):
  key = jax.random.key(7)
  jsonl = str(tmp_path / "d.jsonl")
  out = str(tmp_path / "tfds")
  problems = static.write_dataset(jsonl, name, key, 40, level=level)
  assert static.write_tfds_dataset(out, name, key, 40, level=level) == problems
  evals = static.write_tfds_dataset(out, name, jax.random.key(8), 6, level=level, split="eval")
  assert os.path.isfile(os.path.join(out, "dataset_info.json"))
  assert any(f.startswith(f"{tfds_data.NAME}-train.array_record") for f in os.listdir(out))
  from_json, from_tfds = static.StaticDataset(jsonl), static.StaticDataset(out)
  assert from_tfds.problems == problems + evals  # data back as tuples
  assert from_tfds.splits == ["train"] * 40 + ["eval"] * 6
  assert from_tfds.pool() == from_json.pool() == problems
  assert from_tfds.pool(split="eval") == evals
  for seed in (0, 1):  # same seed, same order
    k = jax.random.key(seed)
    assert from_tfds.sample(k, 100) == from_json.sample(k, 100)
  assert from_tfds.chars == from_json.chars and set(from_tfds.chars) <= set(envs.CHARSET)
  for p in from_tfds.problems:  # the named env verifies
    assert from_tfds.verify(p, p.answer) == 1.0 and from_tfds.verify(p, p.answer + "7") == 0.0
    assert from_tfds.verify(p, None) == 0.0
  assert from_tfds.max_prompt_chars() == max(len(p.prompt) for p in problems + evals)


def test_sampling_is_seeded_with_epochs(tmp_path):
  out = str(tmp_path / "tfds")
  problems = static.write_tfds_dataset(out, "tron/sub", jax.random.key(0), 12, level=2)
  ds = static.StaticDataset(out)
  a = ds.sample(jax.random.key(1), 30)
  assert a == ds.sample(jax.random.key(1), 30)
  assert a != ds.sample(jax.random.key(2), 30)
  assert a[:12] == ds.sample(jax.random.key(1), 12)
  for epoch in range(2):  # every problem once per epoch, reshuffled
    assert sorted(p.uid for p in a[12 * epoch : 12 * (epoch + 1)]) == sorted(
      p.uid for p in problems
    )
  assert a[:12] != a[12:24]
  stream = ds.stream(5)
  assert [stream[i] for i in range(13, 20)] == [ds.stream(5)[i] for i in range(13, 20)]
  assert len(ds.stream(5, num_epochs=2)) == 24
  with pytest.raises(ValueError, match="no eval problems"):
    ds.sample(jax.random.key(0), 1, split="eval")
  with pytest.raises(static.DatasetError, match="already has a 'train' split"):
    static.write_tfds_dataset(out, "tron/sub", jax.random.key(0), 3, level=2)
  fresh = static.write_tfds_dataset(out, "tron/sub", jax.random.key(9), 3, level=2, overwrite=True)
  assert static.StaticDataset(out).problems == fresh


def test_users_own_tfds_dataset_plugs_in(tmp_path):
  text = tfds.features.Text
  qa = [{"prompt": f"Q{i}+{i}=", "answer": str(2 * i), "question_id": str(i)} for i in range(6)]
  root = tmp_path / "data"
  _write_user_dataset(
    str(root / "my_ds" / "1.0.0"),
    {"prompt": text(), "answer": text(), "question_id": text()},
    {"train": qa[:5], "test": qa[5:]},
  )  # train: two shards
  for ds in (
    static.StaticDataset.from_tfds(str(root), env="exact", level=1),  # a folder
    static.StaticDataset.from_tfds("my_ds:1.0.0", data_dir=str(root), env="exact", level=1),
  ):  # a name
    assert [p.prompt for p in ds.pool()] == [q["prompt"] for q in qa[:5]]
    assert [p.answer for p in ds.pool(split="eval")] == ["10"]
    p = ds.pool()[1]
    assert (p.env, p.level, p.uid, p.data) == ("exact", 1, "Q1+1=", ())
    assert ds.verify(p, " 2\n") == 1.0 and ds.verify(p, "3") == 0.0 and ds.verify(p, None) == 0.0
    assert set(ds.chars) == set("".join(q["prompt"] + q["answer"] for q in qa))
    assert ds.sample(jax.random.key(0), 8) == ds.sample(jax.random.key(0), 8)
  only_test = static.StaticDataset.from_tfds(str(root), env="exact", splits={"test": "train"})
  assert [p.answer for p in only_test.pool()] == ["10"] and not only_test.pool(split="eval")
  # Problems of a registered env, with env / level / data features: verified by that env.
  sub = envs.ENVS["tron/sub"].sample(jax.random.key(0), 3, level=2, split="train")
  rows = [
    {
      "prompt": p.prompt,
      "answer": p.answer,
      "env": p.env,
      "level": p.level,
      "data": json.dumps(p.data),
    }
    for p in sub
  ]
  own = _write_user_dataset(
    str(tmp_path / "sub"),
    {
      "prompt": text(),
      "answer": text(),
      "env": text(),
      "data": text(),
      "level": tfds.features.Scalar(dtype=np.int32),
    },
    {"train": rows},
  )
  assert static.StaticDataset.from_tfds(own).problems == sub


def _malformed(tmp_path, features, row, **kwargs):
  out = _write_user_dataset(str(tmp_path / "bad"), features, {"train": [row]})
  return lambda: static.StaticDataset.from_tfds(out, **kwargs)


@pytest.mark.parametrize(
  "features,row,kwargs,match",
  [
    (
      ["prompt"],
      {"prompt": "S25-27="},
      {"env": "exact"},
      r"bad: TFDS dataset has no 'answer' feature \(features: \['prompt'\]\)",
    ),
    (["answer"], {"answer": "-2"}, {"env": "exact"}, "has no 'prompt' feature"),
    (
      ["prompt", "answer"],
      {"prompt": "S25-27=", "answer": "-2"},
      {},
      "has no 'env' feature and no default env",
    ),
    (
      ["prompt", "answer", "level"],
      {"prompt": "S25-27=", "answer": "-2", "level": "2"},
      {"env": "exact"},
      "feature 'level' must be a scalar integer feature",
    ),
    (
      ["prompt", "answer", "data"],
      {"prompt": "S25-27=", "answer": "-2", "data": "[2, 25"},
      {"env": "tron/sub"},
      r"bad:train\[0\]: feature 'data' must be JSON text",
    ),
    (
      ["prompt", "answer", "data"],
      {"prompt": "S25-27=", "answer": "2", "data": "[2, 25, 27]"},
      {"env": "tron/sub", "level": 2},
      r"bad:train\[0\]: the stored answer '2' does not verify",
    ),
    (
      ["prompt", "answer"],
      {"prompt": "x", "answer": "y"},
      {"env": "tron/nope"},
      "unknown env 'tron/nope'",
    ),
  ],
)
def test_malformed_tfds_dataset_names_the_problem(tmp_path, features, row, kwargs, match):
  spec = {k: tfds.features.Text() for k in features}
  load = _malformed(tmp_path, spec, row, **kwargs)
  with pytest.raises(static.DatasetError, match=match):
    load()


def test_missing_and_unknown_tfds_datasets(tmp_path):
  with pytest.raises(FileNotFoundError, match="no dataset file or TFDS dataset directory"):
    static.StaticDataset(str(tmp_path / "absent"))
  (tmp_path / "empty").mkdir()
  with pytest.raises(static.DatasetError, match="no TFDS dataset"):
    static.StaticDataset(str(tmp_path / "empty"))
  with pytest.raises(static.DatasetError, match="no TFDS dataset of that name"):
    static.StaticDataset.from_tfds("nope_ds", data_dir=str(tmp_path), env="exact")
  out = _write_user_dataset(
    str(tmp_path / "odd"),
    {"prompt": tfds.features.Text(), "answer": tfds.features.Text()},
    {"holdout": [{"prompt": "a", "answer": "b"}]},
  )
  with pytest.raises(static.DatasetError, match=r"split\(s\) \['holdout'\] are neither"):
    static.StaticDataset.from_tfds(out, env="exact")
  with pytest.raises(static.DatasetError, match="no TFDS split 'train'"):
    static.StaticDataset.from_tfds(out, env="exact", splits={"train": "train"})
  assert len(static.StaticDataset.from_tfds(out, env="exact", splits={"holdout": "eval"})) == 1


def test_jsonl_malformed_line_still_named(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text('{"prompt": "S25-27=", "env": "tron/sub", "level": 2}\n', encoding="utf-8")
  with pytest.raises(static.DatasetError, match=r"bad.jsonl:1: missing field\(s\) \['answer'\]"):
    static.StaticDataset(str(path))


def test_no_tensorflow_import(tmp_path):
  """Importing the envs, writing and reading a TFDS dataset never imports TensorFlow."""
  code = f"""
import sys
import posttrain_jax.envs
assert "tensorflow" not in sys.modules, "import posttrain_jax.envs imported tensorflow"
assert "tensorflow_datasets" not in sys.modules and "grain" not in sys.modules
import jax
from posttrain_jax.envs import static
static.write_tfds_dataset({str(tmp_path / 'd')!r}, "tron/sub", jax.random.key(0), 5, level=2)
ds = static.StaticDataset({str(tmp_path / 'd')!r})
assert len(ds.sample(jax.random.key(0), 7)) == 7
bad = sorted(m for m in sys.modules if m == "tensorflow" or m.startswith("tensorflow."))
assert not bad, bad
print("ok")
"""
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=False
  )
  assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
