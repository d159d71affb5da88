"""Static datasets as TensorFlow-Datasets (TFDS) datasets in array_record format.

The static arm's problems are stored as a TFDS dataset: a directory holding ``dataset_info.json``,
``features.json`` and one array_record file per shard and split
(``static_problems-train.array_record-00000``). It is written with ``tfds.core.SequentialWriter``
and read with a TFDS data source (``tfds.builder_from_directory(dir).as_data_source(split)``, what
``tfds.data_source`` returns for a named dataset) iterated through grain; neither writing nor
reading needs TensorFlow, and nothing here imports it.

Features of a static dataset (every string feature is ``tfds.features.Text``, a scalar):

  ============  ==========  ===================================================================
  feature       required    meaning
  ============  ==========  ===================================================================
  ``prompt``    yes         the text the model continues
  ``answer``    yes         the reference answer the verifier accepts
  ``env``       no          the registered env (or verifier rule) that verifies the problem;
                            without it the caller names one (``env=``, e.g. ``'exact'``)
  ``level``     no          integer difficulty level (default ``level=``, 0)
  ``uid``       no          canonical identity (default: the prompt)
  ``data``      no          JSON text of the env's latent state (``Problem.data``; default ``[]``)
  ============  ==========  ===================================================================

Other features are ignored. TFDS splits map to the env splits: ``train`` -> 'train' and
``eval``/``test``/``validation`` -> 'eval' unless ``splits=`` says otherwise. So a user's own TFDS
dataset (array_record format) with ``prompt`` and ``answer`` string features plugs into the same
reader: ``StaticDataset.from_tfds('/data/my_ds/1.0.0', env='exact')``, or by name with
``StaticDataset.from_tfds('my_ds:1.0.0', data_dir='/data')``.
"""

import json
import os
from collections.abc import Iterable, Mapping

from posttrain_jax.envs import base, catalogue

NAME = "static_problems"
VERSION = "1.0.0"
STRING_FEATURES = ("prompt", "answer", "env", "uid", "data")
REQUIRED = ("prompt", "answer")
# TFDS split name -> env split, when the caller gives no ``splits=``.
DEFAULT_SPLITS = {"train": "train", "eval": "eval", "test": "eval", "validation": "eval"}
MAX_EXAMPLES_PER_SHARD = 1 << 20


def _tfds():
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  return tfds


def features():
  """The ``FeaturesDict`` ``write_tfds`` stores."""
  tfds = _tfds()
  import numpy as np  # pylint: disable=import-outside-toplevel

  spec = {k: tfds.features.Text() for k in STRING_FEATURES}
  spec["level"] = tfds.features.Scalar(dtype=np.int64)
  return tfds.features.FeaturesDict(spec)


def problem_to_example(problem: base.Problem) -> dict:
  """The TFDS example of a problem (``data`` as JSON text)."""
  return {
    "prompt": problem.prompt,
    "answer": problem.answer,
    "env": problem.env,
    "uid": problem.uid,
    "level": int(problem.level),
    "data": json.dumps(problem.data, separators=(",", ":")),
  }


def _is_dataset_dir(path: str) -> bool:
  return os.path.isfile(os.path.join(path, "dataset_info.json"))


def write_tfds(
  out_dir: str, problems: Iterable[base.Problem], *, split: str = "train", overwrite: bool = False
) -> int:
  """Writes ``problems`` as split ``split`` of the TFDS dataset in ``out_dir`` (array_record),
  creating it, or adding the split to a static dataset already there. ``overwrite``: first
  remove a dataset already in ``out_dir``. Returns how many problems were written."""
  base.check_split(split)
  tfds = _tfds()
  if overwrite and _is_dataset_dir(out_dir):
    meta = ("dataset_info.json", "features.json", "metadata.json")
    for f in os.listdir(out_dir):
      if f in meta or f.startswith(f"{NAME}-"):
        os.remove(os.path.join(out_dir, f))
  append = _is_dataset_dir(out_dir)
  if append:
    existing = tfds.builder_from_directory(out_dir).info
    if existing.name != NAME:
      raise base.DatasetError(
        f"{out_dir}: holds the TFDS dataset {existing.name!r}, not a "
        f"static dataset ({NAME!r}); write elsewhere"
      )
    if split in existing.splits:
      raise base.DatasetError(
        f"{out_dir}: already has a {split!r} split; pass overwrite=True to replace the dataset"
      )
  os.makedirs(out_dir, exist_ok=True)
  identity = tfds.core.DatasetIdentity(
    name=NAME, version=tfds.core.Version(VERSION), data_dir=out_dir, module_name=__name__
  )
  info = tfds.core.DatasetInfo(
    builder=identity,
    features=features(),
    disable_shuffling=True,
    description="Generated problems of posttrain_jax's static arm (envs/tfds_data.py).",
  )
  writer = tfds.core.SequentialWriter(
    info,
    max_examples_per_shard=MAX_EXAMPLES_PER_SHARD,
    overwrite=not append,
    file_format="array_record",
  )
  writer.initialize_splits([split])
  examples = [problem_to_example(p) for p in problems]
  writer.add_examples({split: examples})
  writer.close_all()
  return len(examples)


def write_tfds_dataset(
  out_dir: str,
  env,
  key,
  n: int,
  *,
  level: int,
  split: str = "train",
  overwrite: bool = False,
  **sample_kwargs,
) -> list[base.Problem]:
  """Draws ``n`` problems of ``level`` from ``split`` of ``env`` (an env or a registry name) with
  ``key`` and writes them as split ``split`` of the TFDS dataset ``out_dir``. Returns them."""
  env = catalogue.ENVS[env] if isinstance(env, str) else env
  problems = env.sample(key, n, level=level, split=split, **sample_kwargs)
  write_tfds(out_dir, problems, split=split, overwrite=overwrite)
  return problems


def find_dataset_dir(path: str) -> str:
  """``path`` if it holds ``dataset_info.json``, else the one TFDS dataset below it
  (``<path>/<name>/<version>`` or ``<path>/<name>/<config>/<version>``)."""
  if _is_dataset_dir(path):
    return path
  found = []
  for root, dirs, files in os.walk(path):
    if "dataset_info.json" in files:
      found.append(root)
      dirs.clear()
    elif os.path.relpath(root, path).count(os.sep) >= 2:
      dirs.clear()
  if len(found) == 1:
    return found[0]
  if not found:
    raise base.DatasetError(
      f"{path}: no TFDS dataset (no dataset_info.json here or up to three levels below)"
    )
  raise base.DatasetError(f"{path}: holds several TFDS datasets {sorted(found)}; name one")


def _feature_kind(feature) -> str:
  from tensorflow_datasets.core.utils import dtype_utils  # pylint: disable=import-outside-toplevel

  if tuple(getattr(feature, "shape", (None,))) != () or not hasattr(feature, "np_dtype"):
    return "other"
  if dtype_utils.is_string(feature.np_dtype):
    return "string"
  if dtype_utils.is_integer(feature.np_dtype):
    return "integer"
  return "other"


def check_features(where: str, features, *, env: str | None) -> None:
  """DatasetError naming the first feature missing or of the wrong kind."""
  names = list(features.keys()) if hasattr(features, "keys") else []
  expected = (
    "a static dataset needs string features 'prompt' and 'answer', and optionally "
    "'env', 'uid', 'data' (JSON text) and an integer 'level'"
  )
  for name in REQUIRED:
    if name not in names:
      raise base.DatasetError(
        f"{where}: TFDS dataset has no {name!r} feature (features: {sorted(names)}); {expected}"
      )
  if "env" not in names and env is None:
    raise base.DatasetError(
      f"{where}: TFDS dataset has no 'env' feature and no default env "
      "was given; pass env=<registered env or verifier rule, e.g. "
      "'exact'>"
    )
  for name in names:
    want = "integer" if name == "level" else "string" if name in STRING_FEATURES else None
    if want is not None and _feature_kind(features[name]) != want:
      raise base.DatasetError(
        f"{where}: feature {name!r} must be a scalar {want} feature, "
        f"got {type(features[name]).__name__}; {expected}"
      )


def _text(value):
  if hasattr(value, "item") and getattr(value, "shape", None) == ():
    value = value.item()
  return value.decode("utf-8") if isinstance(value, bytes) else value


def example_to_record(example: Mapping, split: str, *, env: str | None, level: int) -> dict:
  """The static record (``record_to_problem``'s input) of a TFDS example."""
  record = {k: _text(example[k]) for k in ("prompt", "answer", "env", "uid") if k in example}
  record.setdefault("env", env)
  record["level"] = int(example["level"]) if "level" in example else level
  if "data" in example:
    text = _text(example["data"])
    try:
      record["data"] = json.loads(text) if text else []
    except (json.JSONDecodeError, TypeError) as e:
      raise ValueError(f"feature 'data' must be JSON text, got {text!r} ({e})") from None
  record["split"] = split
  return record


def read_tfds(
  path: str,
  *,
  data_dir: str | None = None,
  splits: Mapping[str, str] | None = None,
  env: str | None = None,
  level: int = 0,
) -> Iterable[tuple[str, dict]]:
  """A ``StaticDataset`` reader: (``'<split>[<index>]'``, record) for every example of a TFDS
  dataset, split by split in file order. ``path``: a dataset directory (or a folder with one
  below it), or a dataset name (``'my_ds'``, ``'my_ds:1.0.0'``) found in ``data_dir``.
  ``splits``: TFDS split -> 'train'/'eval' (default ``DEFAULT_SPLITS``; other splits are an
  error unless ``splits`` is given, which then selects the splits read). ``env``/``level``:
  defaults for datasets without those features."""
  import grain  # pylint: disable=import-outside-toplevel

  tfds = _tfds()
  if os.path.isdir(path):
    builder = tfds.builder_from_directory(find_dataset_dir(path))
    source = builder.as_data_source
  else:
    if os.sep in path or path.endswith((".jsonl", ".json")):
      raise FileNotFoundError(f"no dataset at {path!r}")
    try:
      builder = tfds.builder(path, data_dir=data_dir)
    except Exception as e:  # pylint: disable=broad-except
      raise base.DatasetError(
        f"{path}: no TFDS dataset of that name in data_dir={data_dir!r} "
        f"({type(e).__name__}: {str(e).splitlines()[0]})"
      ) from None
    source = lambda split: tfds.data_source(path, split=split, data_dir=data_dir, download=False)
  info = builder.info
  check_features(path, info.features, env=env)
  names = list(info.splits.keys())
  if splits is None:
    unknown = [s for s in names if s not in DEFAULT_SPLITS]
    if unknown:
      raise base.DatasetError(
        f"{path}: TFDS split(s) {unknown} are neither train nor eval; "
        "pass splits={<tfds split>: 'train' or 'eval'}"
      )
    splits = {s: DEFAULT_SPLITS[s] for s in names}
  for tfds_split, split in splits.items():
    if tfds_split not in names:
      raise base.DatasetError(f"{path}: no TFDS split {tfds_split!r}; splits: {names}")
    base.check_split(split)
    file_format = getattr(info, "file_format", None)
    try:
      data = grain.MapDataset.source(source(tfds_split))
    except NotImplementedError as e:
      raise base.DatasetError(
        f"{path}: cannot read the {file_format} files by random access "
        f"({e}); store the dataset in array_record format"
      ) from None
    for index, example in enumerate(data):
      where = f"{tfds_split}[{index}]"
      try:
        record = example_to_record(example, split, env=env, level=level)
      except (ValueError, UnicodeDecodeError) as e:
        raise base.DatasetError(f"{path}:{where}: {e}") from None
      yield where, record
