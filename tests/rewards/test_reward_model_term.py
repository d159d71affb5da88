"""rewards/reward_model.py: the Bradley-Terry loss and its gradient against hand-written
references, the score read at the last valid token (a manual forward of the unpadded sequence;
invariant to padding and batch composition), the layout, and the term ``reward_model`` on a
saved (untrained) model: loading, caching, normalisation, errors."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posttrain_jax import envs, models
from posttrain_jax import io as ptio
from posttrain_jax.registry import ConfigError
from posttrain_jax.rewards import REWARDS, RunInfo, catalogue
from posttrain_jax.rewards import reward_model as rm


def _np_loss(rc, rr, margin, coef):
  """The loss by a Python loop over the pairs."""
  total_bt, total_c = 0.0, 0.0
  for c, r, m in zip(rc, rr, margin):
    total_bt += np.log1p(np.exp(-(c - r - m)))  # -log sigmoid(x) = log(1 + e^-x)
    total_c += (c + r) ** 2
  n = len(rc)
  return total_bt / n + coef * total_c / n


def test_bradley_terry_loss_matches_a_loop():
  rng = np.random.default_rng(0)
  rc, rr, m = rng.normal(size=7), rng.normal(size=7), rng.uniform(0, 2, size=7)
  for coef in (0.0, 0.05):
    loss, metrics = rm.bradley_terry_loss(jnp.asarray(rc), jnp.asarray(rr), jnp.asarray(m), coef)
    np.testing.assert_allclose(float(loss), _np_loss(rc, rr, m, coef), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["accuracy"]), np.mean(rc > rr), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["margin"]), np.mean(rc - rr), rtol=1e-5)
  no_margin, _ = rm.bradley_terry_loss(jnp.asarray(rc), jnp.asarray(rr))
  np.testing.assert_allclose(float(no_margin), _np_loss(rc, rr, 0 * m, 0.0), rtol=1e-5)
  # the margin raises the loss of a pair whose gap is below it
  low, _ = rm.bradley_terry_loss(jnp.asarray([1.0]), jnp.asarray([0.0]), jnp.asarray([0.0]))
  high, _ = rm.bradley_terry_loss(jnp.asarray([1.0]), jnp.asarray([0.0]), jnp.asarray([2.0]))
  np.testing.assert_allclose(
    [float(low), float(high)], [np.log1p(np.exp(-1.0)), np.log1p(np.exp(1.0))], rtol=1e-6
  )


def test_bradley_terry_gradient_by_hand():
  """d/dr_c = (-(1 - s) + 2 k (r_c + r_r)) / n and d/dr_r = (1 - s + 2 k (r_c + r_r)) / n, with
  s = sigmoid(r_c - r_r - m)."""
  rc, rr, m = np.array([0.3, -1.2, 2.0]), np.array([0.1, 0.4, -0.5]), np.array([0.0, 0.5, 1.0])
  k, n = 0.1, 3
  grad = jax.grad(lambda a, b: rm.bradley_terry_loss(a, b, jnp.asarray(m), k)[0], argnums=(0, 1))(
    jnp.asarray(rc), jnp.asarray(rr)
  )
  s = 1 / (1 + np.exp(-(rc - rr - m)))
  np.testing.assert_allclose(np.asarray(grad[0]), (-(1 - s) + 2 * k * (rc + rr)) / n, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(grad[1]), ((1 - s) + 2 * k * (rc + rr)) / n, rtol=1e-5)


@pytest.fixture(scope="module")
def tokenizer():
  return models.build_char_tokenizer("0123456789+=")


@pytest.fixture(scope="module")
def scalar_model():
  config = rm.scalar_config(models.preset("nano", vocab_size=16, max_seq_len=64))
  return models.init_decoder(config, 3)


def test_encode_appends_eos_and_truncates(tokenizer):
  ids = rm.encode(tokenizer, ["12+3=", "1+1="], ["15", "2222222"], max_len=8)
  eos = tokenizer.eos_token_id
  assert ids[0] == tokenizer("12+3=15", add_special_tokens=False)["input_ids"] + [eos]
  assert len(ids[1]) == 8 and ids[1][-1] == eos  # cut: the first 7 tokens, then the EOS
  assert ids[1][:7] == tokenizer("1+1=222", add_special_tokens=False)["input_ids"]
  with pytest.raises(ValueError, match="max_len"):
    rm.encode(tokenizer, ["1"], ["2"], max_len=1)


def test_score_is_the_last_valid_token_of_an_unpadded_forward(scalar_model):
  graphdef, params = scalar_model
  rng = np.random.default_rng(1)
  rows = [rng.integers(3, 16, size=n).tolist() for n in (1, 12)]
  tokens, lengths = rm.pad(rows, 16, pad_id=0)
  got = np.asarray(rm.make_score_fn(graphdef)(params, tokens, lengths))
  forward = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t).logits[0, :, 0])
  for i, row in enumerate(rows):  # each row alone, unpadded: its last position
    want = float(forward(params, jnp.asarray([row], jnp.int32))[-1])
    np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-6)
  # a read at the last column (the first pad's neighbourhood) gives other numbers
  last_column = rm.make_score_fn(graphdef)(params, tokens, np.full_like(lengths, 16))
  assert not np.allclose(got, np.asarray(last_column), atol=1e-4)


def test_score_is_invariant_to_padding_and_batch(scalar_model):
  graphdef, params = scalar_model
  fn = rm.make_score_fn(graphdef)
  rng = np.random.default_rng(2)
  rows = [rng.integers(3, 16, size=n).tolist() for n in (4, 7, 2, 6)]
  base = np.asarray(fn(params, *rm.pad(rows, 8, 0)))
  for length in (32,):  # more padding
    np.testing.assert_allclose(
      np.asarray(fn(params, *rm.pad(rows, length, 0))), base, rtol=1e-5, atol=1e-6
    )
  alone = [float(fn(params, *rm.pad([r], 8, 0))[0]) for r in rows]  # each in a batch of one
  np.testing.assert_allclose(alone, base, rtol=1e-5, atol=1e-6)
  mixed = rows[::-1] + [rng.integers(3, 16, size=8).tolist()]  # other rows, other order
  np.testing.assert_allclose(
    np.asarray(fn(params, *rm.pad(mixed, 8, 0)))[:4][::-1], base, rtol=1e-5, atol=1e-6
  )
  # padded with another id than the text's: still the same (pad tokens are never read)
  np.testing.assert_allclose(
    np.asarray(fn(params, *rm.pad(rows, 8, 5))), base, rtol=1e-5, atol=1e-6
  )


def test_score_ids_buckets_rows_and_lengths(scalar_model):
  graphdef, params = scalar_model
  shapes = []

  def fn(p, tokens, lengths):
    shapes.append(tokens.shape)
    return rm.make_score_fn(graphdef)(p, tokens, lengths)

  rows = [[3] * n for n in range(1, 12)]
  out = rm.score_ids(fn, params, rows, pad_id=0, max_len=32, batch_rows=8)
  assert shapes == [(8, 8), (8, 16)]  # 8 rows of <= 8 tokens, then 3 rows of <= 11
  direct = np.asarray(rm.make_score_fn(graphdef)(params, *rm.pad(rows, 16, 0)))
  np.testing.assert_allclose(out, direct, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, scalar_model, tokenizer):
  """An (untrained) reward model saved as the stage saves one, in WORKDIR/reward_model."""
  workdir = tmp_path_factory.mktemp("rm_saved")
  graphdef, params = scalar_model
  stage = os.path.join(workdir, rm.STAGE)
  os.makedirs(stage)
  ckpt = ptio.Checkpointer(os.path.join(stage, "final"), max_to_keep=1)
  ckpt.save(0, params, {"stage": rm.STAGE})
  ckpt.close()
  config = nnx.merge(graphdef, params).config
  rm.save_meta(stage, config, tokenizer, max_len=16, stats={"mean": 0.25, "std": 2.0})
  return str(workdir)


def test_term_scores_with_the_saved_model(saved, scalar_model, tokenizer):
  graphdef, params = scalar_model
  fn = REWARDS["reward_model"]
  assert catalogue.is_batched(fn) and catalogue.resolve("reward_model") is fn
  problems = [_problem("12+3="), _problem("4+4=")]
  completions = ["15", "8"]
  run = RunInfo(workdir=saved)
  raw = fn(problems, completions, run=run, normalize=False)
  ids = rm.encode(tokenizer, ["12+3=", "4+4="], completions, 16)
  want = np.asarray(rm.make_score_fn(graphdef)(params, *rm.pad(ids, 16, 0)))
  np.testing.assert_allclose(raw, want, rtol=1e-5, atol=1e-6)
  assert raw.dtype == np.float32 and raw.shape == (2,)
  normed = fn(problems, completions, run=run)  # normalize=True: (r - 0.25) / 2
  np.testing.assert_allclose(normed, (want - 0.25) / 2.0, rtol=1e-5, atol=1e-6)
  assert len(run.cache) == 1  # loaded once, kept for the run
  (cached,) = run.cache.values()
  fn(problems, completions, run=run)
  assert list(run.cache.values()) == [cached]
  # the same model named by its final folder, its stage folder or the workdir
  for path in (saved, os.path.join(saved, rm.STAGE), os.path.join(saved, rm.STAGE, "final")):
    np.testing.assert_allclose(
      fn(problems, completions, run=RunInfo(), path=path, normalize=False),
      want,
      rtol=1e-5,
      atol=1e-6,
    )


def test_term_without_a_model_says_so(tmp_path):
  with pytest.raises(ConfigError, match="no trained reward model.*reward_model' stage"):
    REWARDS["reward_model"]([_problem("1+1=")], ["2"], run=RunInfo(workdir=str(tmp_path)))
  with pytest.raises(ConfigError, match="needs kwargs path"):
    REWARDS["reward_model"]([_problem("1+1=")], ["2"], run=RunInfo())


def test_meta_file_holds_what_loading_needs(saved):
  with open(os.path.join(saved, rm.STAGE, rm.META_FILE), encoding="utf-8") as f:
    meta = json.load(f)
  assert meta["model"]["output_dim"] == 1 and meta["max_len"] == 16
  assert (meta["mean"], meta["std"]) == (0.25, 2.0)
  loaded = rm.load(saved)
  assert loaded.max_len == 16 and loaded.path.endswith(os.path.join(rm.STAGE, "final"))


def _problem(prompt):
  return envs.Problem(prompt=prompt, answer="", env="arithmetic", level=1, uid=prompt)
