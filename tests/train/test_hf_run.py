"""The real-model path: GRPO from a local Hugging Face folder, then export back to HF format."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from posttrain_jax import envs, models
from posttrain_jax import methods as methods_lib

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _hf_folder(path):
  """A tiny random Qwen3 with our char tokenizer (and a trivial chat template) in ``path``."""
  tokenizer = models.build_char_tokenizer(envs.CORE_CHARSET)
  tokenizer.chat_template = "{{ messages[0]['content'] }}"
  config = transformers.Qwen3Config(
    vocab_size=len(tokenizer),
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    tie_word_embeddings=False,
    max_position_embeddings=64,
    eos_token_id=tokenizer.eos_token_id,
    pad_token_id=tokenizer.pad_token_id,
  )
  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_config(config).eval()
  model.save_pretrained(path)
  tokenizer.save_pretrained(path)
  return path


def _config(path, chat=False):
  from posttrain_jax.sweeps.reproduce import load_config_module

  module = load_config_module(os.path.join(REPO, "experiments", "hf_grpo.py"))
  c = module.get_config(f"path={path},smoke" + (",chat" if chat else ""))
  c.progress = False
  c.rl.entropy_coef = 0.01  # a random model scores 0 everywhere: no advantage, no update
  return c


def test_lora_grpo_from_hf_folder_then_export(tmp_path):
  hf_dir = _hf_folder(str(tmp_path / "hf"))
  work = tmp_path / "run"
  config = _config(hf_dir, chat=True)
  config.rl.lora.update(rank=4, targets=("q", "v", "up"))
  methods_lib.run(config, str(work))
  records = [json.loads(l) for l in open(work / "rl" / "metrics.jsonl")]
  assert [r["step"] for r in records if "reward/mean" in r] == [1, 2]
  assert "eval/accuracy" in records[-1]
  summary = json.load(open(work / "summary.json"))
  assert "accuracy_after_rl" in summary
  # Export the RL result; transformers loads it and computes our logits.
  out = tmp_path / "export"
  proc = subprocess.run(
    [sys.executable, "scripts/export_hf.py", str(work), str(out)],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  exported = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
  ours, _ = models.hf.load_pretrained(str(out), dtype="float32")
  tokens = np.random.default_rng(0).integers(0, exported.config.vocab_size, (2, 11))
  with torch.no_grad():
    theirs = exported(torch.from_numpy(tokens)).logits.numpy()
  np.testing.assert_allclose(np.asarray(ours(tokens.astype(np.int32)).logits), theirs, atol=1e-4)
  # RL moved the weights away from the starting checkpoint, through the adapters only: the
  # merged export differs from the base on the adapted projections and nowhere else.
  start = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
  with torch.no_grad():
    assert not np.allclose(start(torch.from_numpy(tokens)).logits.numpy(), theirs, atol=1e-6)
  base, tuned = dict(start.named_parameters()), dict(exported.named_parameters())
  for name, value in base.items():
    same = torch.equal(value, tuned[name])
    adapted = any(f".{t}_proj." in name for t in ("q", "v", "up"))
    assert same != adapted, name
  rank, d, L = 4, 32, 2  # adapters: q 32->64, v 32->32, up 32->64 per layer
  expected = L * rank * ((d + 64) + (d + 32) + (d + 64))
  assert json.load(open(work / "rl" / "done.json"))["lora/params"] == expected


def test_bad_hf_path_is_a_config_error(tmp_path):
  from posttrain_jax.train import ConfigError

  with pytest.raises(ConfigError, match="not a Hugging Face checkpoint folder"):
    methods_lib.run(_config(str(tmp_path / "nowhere")), str(tmp_path / "run"))


class _PrefixTokenizer:
  """A SentencePiece-like tokenizer: one id per character after a "▁" prefix id."""

  def __call__(self, text, add_special_tokens=False):
    return {"input_ids": ([0] if text else []) + [ord(c) for c in text]}


def test_hf_prompt_length_takes_the_tokenizers_prefix_margin(tmp_path):
  """A character tokenizer's prompts are one token per character, so the 8-character
  arithmetic prompts of an HF folder pad to 8 (not 16); a tokenizer that spends a prefix token
  on a one-character text gets that token of margin."""
  from posttrain_jax import defaults
  from posttrain_jax.train import context as context_lib

  c = defaults.base_config()
  c.env.name, c.env.level = "arithmetic", 3
  c.model.update(hf_path=_hf_folder(str(tmp_path / "hf")))
  ctx = methods_lib.make_context(c, str(tmp_path / "run"))
  assert ctx.prompt_len == 8
  assert context_lib._leading_margin(ctx.tokenizer, "0123+=") == 0
  assert context_lib._leading_margin(_PrefixTokenizer(), "0123+=") == 1
  assert context_lib._leading_margin(_PrefixTokenizer(), "") == 0
