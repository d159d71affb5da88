"""The cme_text term (rewards/cross_model.py): a verifier LM with its own tokenizer (a tiny
random Hugging Face folder) scores texts re-tokenised with it; the mean log-likelihood against
HF's own torch forward, r <= 0, invariance to the batch, and the errors."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from posttrain_jax import (
  envs,  # noqa: E402
  models,  # noqa: E402
  rewards,  # noqa: E402
)
from posttrain_jax.registry import ConfigError  # noqa: E402
from posttrain_jax.rewards import cross_model  # noqa: E402

LETTERS = "abcdefghijklmnopqrstuvwxyz ,:."


@pytest.fixture(scope="module")
def verifier_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("verifier"))
  tokenizer = models.build_char_tokenizer(LETTERS)
  config = transformers.Qwen3Config(
    vocab_size=len(tokenizer),
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    tie_word_embeddings=False,
    max_position_embeddings=128,
    eos_token_id=tokenizer.eos_token_id,
    pad_token_id=tokenizer.pad_token_id,
  )
  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_config(config).eval()
  with torch.no_grad():  # well-separated logits, so the test would see a wrong position
    for p in model.parameters():
      p.mul_(4.0)
  model.save_pretrained(path)
  tokenizer.save_pretrained(path)
  return path, model, tokenizer


def _reference(model, tokenizer, prompt, completion):
  p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
  c = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
  ids = p + c
  with torch.no_grad():
    logits = model(torch.tensor([ids])).logits[0].double()
  logp = torch.log_softmax(logits, dim=-1).numpy()
  return float(np.mean([logp[t - 1, ids[t]] for t in range(len(p), len(ids))]))


def test_cme_text_equals_hf_mean_log_likelihood_and_ignores_the_batch(verifier_dir):
  path, model, tokenizer = verifier_dir
  problems = envs.ENVS["grammar"].sample(__import__("jax").random.key(0), 3, level=2)
  texts = ["the cat runs.", "a dog sees the old fox.", "runs runs"]
  run = rewards.RunInfo()
  got = rewards.REWARDS["cme_text"](problems, texts, run=run, path=path)
  want = [_reference(model, tokenizer, p.prompt, t) for p, t in zip(problems, texts)]
  np.testing.assert_allclose(got, want, atol=2e-4)
  assert (got < 0).all()
  alone = rewards.REWARDS["cme_text"](problems[1:2], texts[1:2], run=run, path=path)
  np.testing.assert_allclose(alone, got[1:2], atol=1e-5)
  assert len(run.cache) == 1  # loaded once


def test_cme_text_errors_name_the_fix(tmp_path):
  with pytest.raises(ConfigError, match="needs kwargs path"):
    cross_model.cme_text([], [], run=rewards.RunInfo())
  with pytest.raises(ConfigError, match="cannot load a verifier LM"):
    cross_model.cme_text([], [], run=rewards.RunInfo(), path=str(tmp_path))


def test_completion_mask_marks_the_completion_positions():
  mask = cross_model.completion_mask(np.asarray([2, 1]), np.asarray([5, 3]), 6)
  np.testing.assert_array_equal(mask, [[0, 0, 1, 1, 1, 0], [0, 1, 1, 0, 0, 0]])
