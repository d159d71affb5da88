"""Bad inputs for tests/faults/test_faults_errors.py: dataset files, Hugging Face folders,
config files, the smoke config in-process, and the entry point as a subprocess."""

import json
import os
import shutil
import subprocess
import sys

import faults_common  # tests/faults/faults_common.py
import jax

from posttrain_jax import envs, models
from posttrain_jax.envs import static
from posttrain_jax.sweeps.reproduce import load_config_module

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SMOKE = "experiments/quickstart.py:smoke"


# -- the entry point ------------------------------------------------------------------------------
def cmd(workdir, *overrides, config=SMOKE) -> list[str]:
  return [
    sys.executable,
    "-m",
    "posttrain_jax.main",
    f"--config={config}",
    f"--workdir={workdir}",
    "--config.progress=False",
    *overrides,
  ]


def run_main(args, timeout=600) -> subprocess.CompletedProcess:
  env = dict(os.environ)
  env["JAX_COMPILATION_CACHE_DIR"] = os.environ["POSTTRAIN_JAX_COMPILATION_CACHE"]
  env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "1"
  return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def error_line(proc: subprocess.CompletedProcess) -> str:
  """The one stderr line of a run refused with exit status 2 (asserted), without 'error: '."""
  assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
  lines = proc.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
  return lines[0][len("error: ") :]


# -- configs --------------------------------------------------------------------------------------
def _module(name: str):
  return load_config_module(os.path.join(REPO, "experiments", name))


smoke_config = faults_common.smoke_config


def hf_config(path: str):
  """experiments/hf_grpo.py's smoke config on the folder ``path`` (progress off)."""
  c = _module("hf_grpo.py").get_config(f"path={path},smoke")
  c.progress = False
  return c


# -- datasets -------------------------------------------------------------------------------------
def good_lines(tmp_path, n: int = 8) -> list[str]:
  """``n`` valid arithmetic records (level 3) as JSON lines."""
  path = str(tmp_path / "good.jsonl")
  static.write_dataset(path, "arithmetic", jax.random.key(0), n, level=3)
  with open(path, encoding="utf-8") as f:
    return f.read().splitlines()


def write(path, content) -> str:
  mode = "wb" if isinstance(content, bytes) else "w"
  with open(path, mode) as f:
    f.write(content)
  return str(path)


def record(line: str, **changes) -> str:
  """``line`` (a JSON record) with fields changed; a value of None removes the field."""
  r = json.loads(line)
  for k, v in changes.items():
    if v is None:
      r.pop(k, None)
    else:
      r[k] = v
  return json.dumps(r)


# -- Hugging Face folders -------------------------------------------------------------------------
def hf_folder(path: str, *, vocab_size: int | None = None) -> str:
  """Our nano decoder (random, 128 positions) with the core char tokenizer, saved as a Hugging
  Face folder; ``vocab_size`` smaller than the tokenizer makes a pair that does not fit."""
  from flax import nnx  # pylint: disable=import-outside-toplevel

  tokenizer = models.build_char_tokenizer(envs.CORE_CHARSET)
  config = models.preset("nano", vocab_size=vocab_size or len(tokenizer), max_seq_len=128)
  models.save_pretrained(
    models.Decoder(config, rngs=nnx.Rngs(0)), config, path, tokenizer=tokenizer
  )
  return path


def copy_folder(src: str, dst: str) -> str:
  shutil.copytree(src, dst)
  return dst


def edit_json(path: str, **changes) -> None:
  with open(path, encoding="utf-8") as f:
    data = json.load(f)
  data.update(changes)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(data, f)
