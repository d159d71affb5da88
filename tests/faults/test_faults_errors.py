"""Issue 21, items 6 and 7: every bad input is one line ``error: ...`` and exit status 2, and
the advice in it leads to a working state; the validator covers every numeric key; datasets,
Hugging Face folders and sequence lengths are checked before anything trains.

Subprocesses of the entry point only where main's own handling is under test (the config file
that cannot load, one error of each library type, a full disk); the rest in-process, with
``main.user_message`` showing the line main prints."""

import errno
import json
import os
import re
import subprocess

import faults_errors_helpers as h
import ml_collections
import pytest

from posttrain_jax import defaults, models
from posttrain_jax import main as main_lib
from posttrain_jax import methods as methods_lib
from posttrain_jax.envs import DatasetError, static
from posttrain_jax.io import disk_full
from posttrain_jax.methods import validate
from posttrain_jax.models.hf_config import HFError
from posttrain_jax.train import ConfigError, config_ranges


def _line(error: BaseException) -> str:
  """The line main prints for ``error`` (asserting it is one of the library's)."""
  line = main_lib.user_message(error, "/unused")
  assert line is not None and "\n" not in line, error
  return line


# -- the entry point: one line, exit 2 ------------------------------------------------------------
def test_main_reports_each_error_kind_in_one_line(tmp_path):
  syntax = h.write(tmp_path / "syntax.py", "def get_config(arg=None)\n  return 1\n")
  raises = h.write(
    tmp_path / "raises.py", "def get_config(arg=None):\n  raise RuntimeError('no such preset')\n"
  )
  lines = h.good_lines(tmp_path)
  data = h.write(tmp_path / "bad.jsonl", lines[0] + "\n{not json\n")
  hf = h.hf_folder(str(tmp_path / "hf"), vocab_size=10)
  work = tmp_path / "w"
  cases = [
    (
      h.cmd(work, config=syntax),
      f"the config file {syntax} has a syntax error at line 1: expected ':'; fix it and rerun",
    ),
    (
      h.cmd(work, config=raises),
      f"the config file {raises} raised RuntimeError at line 2: no such preset",
    ),
    (
      h.cmd(work, f"--config.env.dataset={data}"),  # DatasetError
      f"{data}:2: invalid JSON (Expecting property name enclosed in double quotes at column "
      "2): '{not json'",
    ),
    (
      h.cmd(work, config=f"experiments/hf_grpo.py:path={hf},smoke"),  # HFError
      f"the tokenizer of '{hf}' does not fit its model: 23 tokens, but the model has 10 "
      "embedding rows (vocab_size in config.json); use the tokenizer saved with this model",
    ),
  ]
  for i, (args, want) in enumerate(cases):  # a workdir each: the first run's config stays
    args = [a.replace(f"--workdir={work}", f"--workdir={work}{i}") for a in args]
    assert h.error_line(h.run_main(args)) == want, args
    assert not (tmp_path / f"w{i}" / "pretrain").exists()


def test_a_library_error_wrapped_by_another_is_still_its_line_and_a_bug_is_not():
  wrapped = RuntimeError("rollout producer failed")
  wrapped.__cause__ = DatasetError("d.jsonl:3: missing field(s) ['answer']")
  assert main_lib.user_message(wrapped, "/w") == "d.jsonl:3: missing field(s) ['answer']"
  assert main_lib.user_message(KeyError("reward/mean"), "/w") is None


# -- datasets ----------------------------------------------------------------------------------
RECORD_HINT = (
  "; a record is a JSON object with string fields 'prompt', 'answer', 'env' and an "
  "integer 'level' (optional: 'uid', 'data', 'split'), or a question/answer "
  "record ('question' or 'problem', and 'answer' or 'solution')"
)


def _bad_datasets(tmp_path):
  """name -> (path, the exact DatasetError message)."""
  good = h.good_lines(tmp_path)
  p = lambda name: str(tmp_path / name)
  wrong = h.record(good[1], answer="999999")
  prompt = json.loads(good[1])["prompt"]
  return {
    "malformed JSON line": (
      h.write(p("json.jsonl"), good[0] + "\n{not json\n"),
      f"{p('json.jsonl')}:2: invalid JSON (Expecting property name enclosed in double "
      "quotes at column 2): '{not json'",
    ),
    "empty file": (
      h.write(p("empty.jsonl"), ""),
      f"{p('empty.jsonl')}: no problems (the dataset is empty); write one JSON object a "
      "line, e.g. with envs.static.write_dataset",
    ),
    "binary file": (
      h.write(p("binary.jsonl"), b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff"),
      f"{p('binary.jsonl')}:1: not UTF-8 text (byte 0x89 at column 1); a .jsonl dataset "
      "holds one UTF-8 JSON object a line",
    ),
    "invalid UTF-8": (
      h.write(p("utf8.jsonl"), (good[0] + "\n").encode() + b'{"prompt": "\xff"}\n'),
      f"{p('utf8.jsonl')}:2: not UTF-8 text (byte 0xff at column 13); a .jsonl dataset "
      "holds one UTF-8 JSON object a line",
    ),
    "missing field": (
      h.write(p("missing.jsonl"), h.record(good[0], answer=None) + "\n"),
      f"{p('missing.jsonl')}:1: missing field(s) ['answer']" + RECORD_HINT,
    ),
    "wrong field type": (
      h.write(p("type.jsonl"), h.record(good[0], level="3") + "\n"),
      f"{p('type.jsonl')}:1: field 'level' must be an integer, got '3'" + RECORD_HINT,
    ),
    "unknown suffix": (
      h.write(p("data.csv"), "\n".join(good) + "\n"),
      f"{p('data.csv')}: no reader for '.csv'; readers: ['.jsonl', 'tfds'] ('tfds': a TFDS "
      "dataset directory)",
    ),
    "wrong answer": (
      h.write(p("wrong.jsonl"), good[0] + "\n" + wrong + "\n"),
      f"{p('wrong.jsonl')}:2: the stored answer '999999' does not verify for prompt "
      f"{prompt!r} under env 'arithmetic' (its state gives {prompt!r} -> "
      f"{json.loads(good[1])['answer']!r})",
    ),
    "wrong answer, no data": (
      h.write(p("nodata.jsonl"), h.record(wrong, data=None) + "\n"),
      f"{p('nodata.jsonl')}:1: the stored answer '999999' does not verify for prompt "
      f"{prompt!r} under env 'arithmetic' (its state gives {prompt!r} -> "
      f"{json.loads(good[1])['answer']!r})",
    ),
    "level outside the env": (
      h.write(p("level.jsonl"), h.record(good[0], level=12) + "\n"),
      f"{p('level.jsonl')}:1: level 12 is not a level of env 'arithmetic'; its levels: "
      "[1, 2, 3, 4, 5, 6, 7, 8, 9]",
    ),
    "blank answer": (
      h.write(p("blank.jsonl"), h.record(good[0], answer=" ", env="exact") + "\n"),
      f"{p('blank.jsonl')}:1: the stored answer is blank; every record needs the answer its "
      "prompt should get",
    ),
    "unverifiable data": (
      h.write(
        p("cd.jsonl"),
        json.dumps(dict(prompt="1 2>3:", answer="1+2", env="countdown", level=2, data=[7])) + "\n",
      ),
      f"{p('cd.jsonl')}:1: env 'countdown' cannot verify this record (ValueError: not "
      "enough values to unpack (expected 2, got 1)); check its 'data' field",
    ),
  }


def test_every_bad_dataset_is_one_dataset_error_and_the_fix_loads(tmp_path):
  cases = _bad_datasets(tmp_path)
  for name, (path, want) in cases.items():
    with pytest.raises(DatasetError) as e:
      static.StaticDataset(path)
    assert str(e.value) == want, name
    assert _line(e.value) == want
  # The advice: one valid JSON record a line (the malformed line rewritten) loads.
  path, _ = cases["malformed JSON line"]
  h.write(path, "\n".join(h.good_lines(tmp_path, 3)) + "\n")
  assert len(static.StaticDataset(path)) == 3


def test_a_dataset_without_train_problems_says_how_to_split_it(tmp_path):
  lines = h.good_lines(tmp_path)
  path = h.write(
    tmp_path / "eval_only.jsonl", "\n".join(h.record(l, split="eval") for l in lines) + "\n"
  )
  with pytest.raises(DatasetError) as e:
    static.StaticDataset(path).stream(0)
  assert str(e.value) == (
    f"{path} has no train problems; give records \"split\": \"train\" "
    "(or no split field: a stable share of uids then goes to eval, the "
    "rest to train)"
  )
  h.write(path, "\n".join(h.record(l, split=None) for l in lines) + "\n")  # the advice
  dataset = static.StaticDataset(path)
  train = {p.uid for p in dataset.pool(split="train")}
  stream = dataset.stream(0)
  assert train and {stream[i].uid for i in range(8)} <= train


def test_a_bad_dataset_stops_the_run_before_anything_is_written(tmp_path):
  path, want = _bad_datasets(tmp_path)["wrong answer"]
  with pytest.raises(DatasetError, match=re.escape(want)):
    methods_lib.run(h.smoke_config(env=dict(dataset=path)), str(tmp_path / "w"))
  assert not (tmp_path / "w" / "pretrain").exists()


# -- Hugging Face folders ------------------------------------------------------------------------
def test_bad_hf_folders_are_one_hf_error_and_the_fix_loads(tmp_path):
  good = h.hf_folder(str(tmp_path / "good"))
  folder = lambda name: h.copy_folder(good, str(tmp_path / name))
  nosafe = folder("nosafe")
  os.remove(os.path.join(nosafe, "model.safetensors"))
  shape = folder("shape")
  h.edit_json(os.path.join(shape, "config.json"), intermediate_size=128)
  missing = folder("missing")
  from safetensors.numpy import load_file, save_file  # pylint: disable=import-outside-toplevel

  weights = load_file(os.path.join(missing, "model.safetensors"))
  del weights["model.layers.0.mlp.gate_proj.weight"]
  save_file(weights, os.path.join(missing, "model.safetensors"))
  truncated = folder("truncated")
  with open(os.path.join(truncated, "model.safetensors"), "r+b") as f:
    f.truncate(100)
  notok = folder("notok")
  for name in ("tokenizer.json", "tokenizer_config.json"):
    os.remove(os.path.join(notok, name))
  cases = {
    nosafe: f"{nosafe!r} has no model.safetensors or model.safetensors.index.json (only "
    "safetensors checkpoints are read; re-save a .bin checkpoint with "
    "save_pretrained(safe_serialization=True))",
    shape: f"weight 'model.layers.0.mlp.gate_proj.weight' in {shape} has shape [256, 64], "
    "expected [128, 64] from config.json; config.json does not describe these "
    "weights (use the config.json saved with them)",
    missing: f"weight 'model.layers.0.mlp.gate_proj.weight' not found in {missing} (19 "
    "tensors in the checkpoint): the checkpoint is incomplete or not the "
    "architecture its config.json names; re-save it with save_pretrained",
    notok: f"{notok!r} has no tokenizer files (tokenizer.json / tokenizer_config.json); save "
    "the model's tokenizer there with tokenizer.save_pretrained",
  }
  for path, want in cases.items():
    with pytest.raises(HFError) as e:
      methods_lib.run(h.hf_config(path), str(tmp_path / "w" / os.path.basename(path)))
    assert str(e.value) == want
    assert _line(e.value) == want
  with pytest.raises(
    HFError, match=re.escape(f"{truncated}/model.safetensors is not a readable safetensors file (")
  ):
    methods_lib.run(h.hf_config(truncated), str(tmp_path / "w" / "truncated"))
  # The advice: the config.json saved with the weights, the tokenizer saved beside them.
  h.copy_folder(good, str(tmp_path / "fixed"))
  os.replace(os.path.join(good, "config.json"), os.path.join(shape, "config.json"))
  model, config = models.hf.load_pretrained(shape)
  assert config.mlp_dim == 256
  models.build_char_tokenizer("0123456789+=").save_pretrained(notok)
  assert len(models.hf.load_hf_tokenizer(notok)) == 15


def test_a_tokenizer_with_ids_beyond_the_embedding_is_refused():
  class Tokenizer:  # 6 tokens, but an EOS id past them (a special token added elsewhere)
    eos_token_id, pad_token_id, bos_token_id, unk_token_id = 9, 0, None, 2

    def __len__(self):
      return 6

  config = models.preset("nano", vocab_size=6)
  with pytest.raises(HFError) as e:
    models.hf.check_tokenizer_fits(config, Tokenizer(), "/m")
  assert str(e.value) == (
    "the tokenizer of '/m' does not fit its model: eos_token_id=9, but "
    "the model has 6 embedding rows (vocab_size in config.json); use the "
    "tokenizer saved with this model"
  )
  models.hf.check_tokenizer_fits(models.preset("nano", vocab_size=10), Tokenizer(), "/m")


# -- the validator ------------------------------------------------------------------------------
EXEMPT = {
  "env.level": "a level of config.env.name (its own check)",
  "model.causal_block": "-1, 0 or a block size (its own check)",
  "distributed.num_processes": "parallel.distributed_settings",
  "distributed.process_id": "parallel.distributed_settings",
}


# Every numeric key of the whole config (the engine's and the methods' sections) and its kind.
NUMERIC = config_ranges.numeric_keys(defaults.ROOT)


def _numeric_leaves(section, prefix=""):
  for key in section.keys():
    value, name = section[key], f"{prefix}{key}"
    if isinstance(value, ml_collections.ConfigDict):
      if not key.endswith(("kwargs", "reward_shaping", "overrides")):
        yield from _numeric_leaves(value, name + ".")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
      yield name


def test_every_numeric_default_has_a_range():
  leaves = set(_numeric_leaves(defaults.base_config()))
  assert leaves - set(NUMERIC) - set(EXEMPT) == set()
  assert set(NUMERIC) - leaves == set()


def _set(config, key, value):
  *sections, leaf = key.split(".")
  node = config
  for s in sections:
    node = node[s]
  default = node[leaf]
  integer = isinstance(value, int) or (isinstance(default, int) and not isinstance(default, bool))
  node[leaf] = int(value) if integer else float(value)
  return node[leaf]


@pytest.mark.parametrize("key", sorted(NUMERIC))
def test_a_bad_value_of_every_numeric_key_is_refused_naming_it(key):
  ok, need, bad = config_ranges.KINDS[NUMERIC[key]]
  c = h.smoke_config()
  value = _set(c, key, bad)
  assert not ok(value)
  with pytest.raises(ConfigError) as e:
    validate(c)
  assert str(e.value) == f"config.{key} must be {need}, got {value!r}"
  if isinstance(value, float):
    c = h.smoke_config()
    _set(c, key, float("nan"))
    with pytest.raises(ConfigError, match=rf"^config\.{re.escape(key)} must be .*, got nan$"):
      validate(c)


def test_the_issue_examples_are_refused_and_boundaries_accepted():
  for key, value, want in (
    ("pretrain.lr", -1.0, "config.pretrain.lr must be a number > 0, got -1.0"),
    ("rl.kl_coef", -0.1, "config.rl.kl_coef must be a number >= 0, got -0.1"),
    ("rl.top_p", 0.0, "config.rl.top_p must be a number in (0, 1], got 0.0"),
    (
      "rl.norm_length",
      0,
      "config.rl.norm_length must be None (the max_new_tokens budget) or a positive integer, got 0",
    ),
  ):
    c = h.smoke_config()
    _set(c, key, value)
    with pytest.raises(ConfigError) as e:
      validate(c)
    assert str(e.value) == want
  c = h.smoke_config(pretrain=dict(schedule="linear"))
  with pytest.raises(ConfigError) as e:
    validate(c)
  assert str(e.value) == (
    "config.pretrain.schedule='linear' is unknown; valid names: constant, cosine"
  )
  c = h.smoke_config()
  for key, value in (
    ("rl.top_p", 1.0),
    ("rl.kl_coef", 0.0),
    ("rl.eval_every", 0),
    ("pretrain.grad_clip", 0.0),
    ("rl.lr", float("inf")),
  ):
    _set(c, key, value)
  validate(c)  # inf: the non-finite update guard, not the validator, stops that run


def test_a_setting_without_effect_is_warned_once(capsys):
  c = h.smoke_config(rl=dict(kl_coef=0.1, kl_target=0.5))
  validate(c)
  validate(c)
  assert capsys.readouterr().err == (
    "warning: config.rl.kl_target=0.5 has no effect: only config.rl.kl_controller='adaptive' "
    "reads them\n"
  )
  c.rl.kl_controller = "adaptive"
  assert config_ranges.unused_settings(c, defaults.ROOT) == []
  base = defaults.base_config()
  for keys, _, _ in config_ranges.unused_rules(defaults.ROOT):  # every key the table names exists
    for key in keys:
      config_ranges._lookup(base, key)  # pylint: disable=protected-access


# -- sequence lengths ---------------------------------------------------------------------------
def test_prompts_over_the_model_length_are_refused_and_the_advice_runs(tmp_path):
  long = h.write(
    tmp_path / "long.jsonl",
    json.dumps(dict(prompt="1" * 140 + "=", answer="1", env="exact", level=1)) + "\n",
  )
  c = h.smoke_config(
    env=dict(dataset=long),
    stages=("eval",),
    eval=dict(num_problems=8, batch_size=8, pass_problems=4),
  )
  with pytest.raises(ConfigError) as e:
    methods_lib.run(c, str(tmp_path / "w"))
  want = (
    "sequences need 262 positions, over the model's max_seq_len=256: the longest prompt "
    f"(141 characters, from config.env.dataset={long!r} or the held-out env) pads to 256 "
    "tokens, plus config.rl.max_new_tokens=6; shorten the prompts, lower max_new_tokens "
    "or set config.model.max_seq_len >= 262"
  )
  assert str(e.value) == want and _line(e.value) == want
  c.model.max_seq_len = 262
  methods_lib.run(c, str(tmp_path / "w"))
  summary = json.loads((tmp_path / "w" / "summary.json").read_text())
  assert 0.0 <= summary["accuracy_before_rl"] <= 1.0


# -- a full disk --------------------------------------------------------------------------------
def test_a_full_disk_anywhere_in_the_chain_is_named(tmp_path):
  try:
    try:
      raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "m.jsonl"))
    except OSError as e:
      raise RuntimeError("metric writer failed") from e
  except RuntimeError as e:
    assert disk_full.full_disk_path(e, "/w") == str(tmp_path / "m.jsonl")
  tensorstore = ValueError(
    'RESOURCE_EXHAUSTED: Error writing "x" in OCDBT database at local '
    'file "/w/c/": Failed writing: "/w/c/d/ab": Failed to write 5 bytes '
    "to file 7: No space left on device [os_error_code='28']"
  )
  assert disk_full.full_disk_path(tensorstore, "/w") == "/w/c/d/ab"
  assert disk_full.full_disk_path(ValueError("other"), "/w") is None
  mount = disk_full.device_of("/")
  assert mount.endswith("mounted at /") or mount == "/"
  assert _line(tensorstore) == (
    f"no space left on {mount} (writing /w/c/d/ab); free space and rerun the same command"
  )


def _mount_tmpfs(path, size: str) -> str | None:
  """None when mounted, else why not (not root, no mount)."""
  if os.geteuid() != 0:
    return "mounting a tmpfs needs root"
  proc = subprocess.run(
    ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
    capture_output=True,
    text=True,
  )
  return None if proc.returncode == 0 else f"mount -t tmpfs failed: {proc.stderr.strip()}"


def test_a_full_disk_is_one_line_and_the_same_command_finishes_after_freeing_space(tmp_path):
  disk = tmp_path / "disk"
  disk.mkdir()
  why = _mount_tmpfs(disk, "3m")  # holds pretraining's checkpoint 3 (1.4 MB), not also 6
  if why is not None:
    print(f"skipped: {why}")
    pytest.skip(why)
  try:
    args = h.cmd(disk / "run", "--config.stages=('pretrain',)")
    line = h.error_line(h.run_main(args))
    # checkpoint 6 refused before any of it is written (io/disk_full.require_space)
    assert line == (
      f"no space left on tmpfs (tmpfs) mounted at {disk} (writing "
      f"{disk}/run/pretrain/checkpoints); free space and rerun the same command"
    )
    subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)  # space freed
    proc = h.run_main(args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(l) for l in open(disk / "run" / "pretrain" / "metrics.jsonl")]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
  finally:
    subprocess.run(["umount", str(disk)], check=False)


# -- config files that are not configs (issue 37) ----------------------------------------------
CONFIG_FILES = {
  "dict": (
    "def get_config():\n  return {'rl': {}}\n",
    "get_config() in {p} returned dict, not an ml_collections.ConfigDict; return "
    "ml_collections.ConfigDict(...) (see experiments/quickstart.py)",
  ),
  "none": (
    "def get_config():\n  pass\n",
    "get_config() in {p} returned NoneType, not an ml_collections.ConfigDict; return "
    "ml_collections.ConfigDict(...) (see experiments/quickstart.py)",
  ),
  "no_get_config": (
    "config = {'rl': {}}\n",
    "the config file {p} defines no get_config(); it must define get_config() returning an "
    "ml_collections.ConfigDict (see experiments/quickstart.py)",
  ),
  "nul": (
    b"def get_config():\n  return 1\x00\n",
    "the config file {p} contains NUL bytes: it is not Python source; pass a .py file that "
    "defines get_config() (see experiments/quickstart.py)",
  ),
  "binary": (
    b"\x89PNG\r\n\x1a\n\xff\xfe",
    "the config file {p} is not UTF-8 text (byte 0); save it as UTF-8",
  ),
  "import_raises": (
    "import ml_collections\nraise ImportError('needs a GPU')\ndef get_config():\n  pass\n",
    "the config file {p} raised ImportError at line 2: needs a GPU",
  ),
  "needs_arg": (
    "def get_config(preset):\n  pass\n",
    "the config file {p} raised TypeError: get_config() missing 1 required positional "
    "argument: 'preset'",
  ),
}


@pytest.mark.parametrize("name", sorted(CONFIG_FILES))
def test_a_config_file_that_gives_no_config_is_one_line(tmp_path, name):
  content, want = CONFIG_FILES[name]
  path = h.write(tmp_path / f"{name}.py", content)
  assert main_lib.config_file_problem(path) == want.format(p=path)
  assert main_lib.config_file_problem("experiments/quickstart.py") is None


@pytest.mark.parametrize("name", ["dict", "nul"])
def test_main_refuses_a_config_file_that_is_not_a_config_with_exit_2(tmp_path, name):
  content, want = CONFIG_FILES[name]
  path = h.write(tmp_path / f"{name}.py", content)
  assert h.error_line(h.run_main(h.cmd(tmp_path / "w", config=path))) == want.format(p=path)
  assert not (tmp_path / "w").exists()


# -- memory before it runs out (issue 37) -------------------------------------------------------
def test_a_run_that_cannot_fit_is_refused_before_any_stage(tmp_path):
  from faults_common import smoke_config

  config = smoke_config(rl={"prompts_per_step": 100000, "group_size": 64})
  with pytest.raises(ConfigError) as err:
    methods_lib.run(config, str(tmp_path / "w"))
  line = _line(err.value)
  assert re.fullmatch(
    r"the run needs at least [\d.]+ GiB of memory \(KV cache [\d.]+ GiB, attention scores "
    r"[\d.]+ GiB, logits [\d.]+ GiB\) and this machine has [\d.]+ GiB available; lower "
    r"config\.rl\.prompts_per_step or config\.rl\.group_size \(the rollout batch\), "
    r"config\.rl\.max_new_tokens, or raise config\.rl\.minibatches \(the loss's batch\); a "
    r"smaller model \(config\.model\) shrinks every part",
    line,
  ), line
  assert not (tmp_path / "w" / "pretrain").exists()


def test_the_memory_estimate_counts_the_configured_batch():
  from faults_common import smoke_config

  from posttrain_jax.models.config import ModelConfig
  from posttrain_jax.train import memory

  c = smoke_config()
  m = ModelConfig(
    vocab_size=20, hidden_size=8, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4, mlp_dim=16
  )
  parts = memory.estimate(c, m, 1000, prompt_len=16)
  rows, seq = c.rl.prompts_per_step * c.rl.group_size, 16 + c.rl.max_new_tokens
  assert parts["KV cache"] == rows * 2 * 2 * 1 * 4 * seq * 4
  assert parts["optimizer state"] == 8000
  c.rl.group_size *= 2  # twice the rollouts: twice the cache, the rest of the model unchanged
  assert memory.estimate(c, m, 1000, 16)["KV cache"] == 2 * parts["KV cache"]
  with pytest.raises(ConfigError, match="the run needs at least"):
    memory.check(parts, (sum(parts.values()) - 1, "this machine"))
  memory.check(parts, (sum(parts.values()), "this machine"))


def test_dry_run_prints_the_estimate_and_touches_no_workdir(tmp_path):
  proc = h.run_main(h.cmd(tmp_path / "w", "--dry_run"))
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "memory estimate (a lower bound):" in proc.stdout
  assert re.search(r"fits: this machine has [\d.]+ GiB available", proc.stdout)
  assert not (tmp_path / "w").exists()
