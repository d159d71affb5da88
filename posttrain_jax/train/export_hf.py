"""Export a model as a Hugging Face folder: ``python scripts/export_hf.py SRC OUT``.

SRC is either a run's workdir (``python -m posttrain_jax.main --workdir=SRC``; the final
parameters of ``--stage``, default the last finished stage of the run, with the run's
tokenizer) or a Hugging Face folder (loaded and written back: a round trip through this
library). OUT then loads with ``transformers.AutoModelForCausalLM.from_pretrained(OUT)``.
Errors print one line and exit with status 2.
"""

import argparse
import json
import os
import sys


class ExportError(Exception):
  """The source cannot be exported (one-line message)."""


def _parse(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("src", help="a run workdir or a Hugging Face model folder")
  parser.add_argument("out", help="output Hugging Face folder")
  parser.add_argument(
    "--stage",
    default=None,
    help="run stage whose final parameters to export (default: the last finished stage)",
  )
  parser.add_argument(
    "--model_type",
    default=None,
    choices=("llama", "qwen2", "qwen3"),
    help="HF family (default: the one the model is exactly)",
  )
  parser.add_argument(
    "--dtype",
    default="float32",
    choices=("float32", "bfloat16", "float16"),
    help="tensor dtype on disk",
  )
  parser.add_argument("--max_shard_size", default="5GB", help="e.g. 5GB, 500MB")
  return parser.parse_args(argv)


def _read_json(path):
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise ExportError(f"cannot read {path}: {e}") from e


def _pick_stage(src, run_config, stage):
  finals = [s for s in run_config.get("stages", ()) if os.path.isdir(os.path.join(src, s, "final"))]
  if stage is None:
    if not finals:
      raise ExportError(
        f"run {src} has no finished stage with final parameters "
        f"(stages {list(run_config.get('stages', ()))}); finish a stage first"
      )
    return finals[-1]
  if not os.path.isdir(os.path.join(src, stage, "final")):
    raise ExportError(
      f"run {src} has no final parameters for stage {stage!r} "
      f"(stages with final parameters: {finals or 'none'})"
    )
  return stage


def _load_run(src, stage):
  """(params, ModelConfig, tokenizer) of a run's final parameters."""
  from posttrain_jax.train import experiment

  run_config = _read_json(os.path.join(src, "config.json"))
  stage = _pick_stage(src, run_config, stage)
  params, config, tokenizer = experiment.load_final(src, stage)
  print(f"exporting stage {stage!r} of run {src}", flush=True)
  return params, config, tokenizer


def export(args) -> str:
  from posttrain_jax.models import hf

  if not os.path.isdir(args.src):
    raise ExportError(f"no such folder {args.src!r}")
  if not os.path.isfile(os.path.join(args.src, "config.json")):
    raise ExportError(
      f"{args.src} has no config.json: neither a run workdir nor a Hugging Face folder"
    )
  src_config = _read_json(os.path.join(args.src, "config.json"))
  if "model_type" in src_config:
    if args.stage is not None:
      raise ExportError(f"--stage applies to run workdirs; {args.src} is a Hugging Face folder")
    model, config = hf.load_pretrained(args.src)
    params, tokenizer = model, None
    try:
      tokenizer = hf.load_hf_tokenizer(args.src)
    except (FileNotFoundError, OSError, ValueError):
      pass  # a weights-only folder: export without a tokenizer
  elif "model" in src_config:
    params, config, tokenizer = _load_run(args.src, args.stage)
  else:
    raise ExportError(
      f"{args.src}/config.json has neither 'model_type' (Hugging Face) nor 'model' (a run's config)"
    )
  hf.save_pretrained(
    params,
    config,
    args.out,
    model_type=args.model_type,
    tokenizer=tokenizer,
    dtype=args.dtype,
    max_shard_size=args.max_shard_size,
  )
  return args.out


def main(argv=None) -> int:
  args = _parse(argv)
  from posttrain_jax.io import CheckpointError

  try:
    out = export(args)
  except (ExportError, CheckpointError, FileNotFoundError, ValueError, OSError) as e:
    print(f"error: {e}", file=sys.stderr, flush=True)
    return 2
  print(f"wrote {out}", flush=True)
  return 0
