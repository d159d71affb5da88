"""LaRA in the eval stage (train/contamination_eval.py): unperturbed variants give RSM 0 and RSI
1 at every layer, the log-likelihood baseline is the answer's mean token log-prob from a manual
forward, the AUROCs come out per detector, and the config checks name the missing file."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posttrain_jax import methods as methods_lib
from posttrain_jax.methods import validate
from posttrain_jax.sweeps import runner
from posttrain_jax.train import contamination_eval
from posttrain_jax.train.validate import ConfigError

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(REPO, "experiments", "data")


def _config():
  c = runner.load_config_module(os.path.join(REPO, "experiments", "quickstart.py")).get_config(
    "smoke"
  )
  c.progress = False
  return c


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
  return methods_lib.make_context(
    _config(), str(tmp_path_factory.mktemp("lara")), check_memory=False
  )


def _items(n=12):
  return contamination_eval.load_items(os.path.join(DATA, "lara_seen.jsonl"))[:n]


def test_unperturbed_variants_have_no_shift_and_full_stability(ctx, monkeypatch):
  monkeypatch.setattr(
    type(ctx.env), "variants", lambda self, p: (p.prompt, [p.prompt, p.prompt]), raising=False
  )
  L = nnx.merge(ctx.graphdef, ctx.init_params).config.num_layers
  capture = contamination_eval.rep.make_capture(ctx.graphdef)
  f = contamination_eval.features(ctx, ctx.init_params, _items(), capture, L)
  assert f.shape == (12, 3, L)
  np.testing.assert_allclose(f[:, 0], 0.0, atol=1e-5)  # RSM
  np.testing.assert_allclose(f[:, 2], 1.0, atol=1e-5)  # RSI


def test_loglik_baseline_is_the_answers_mean_log_prob(ctx):
  items = _items(3)
  out = contamination_eval.baselines(ctx, ctx.init_params, items)
  model = nnx.merge(ctx.graphdef, ctx.init_params)
  tok = ctx.tokenizer
  for i, p in enumerate(items):
    ids = tok([p.prompt + p.answer], add_special_tokens=False)["input_ids"][0] + [tok.eos_token_id]
    n_prompt = len(tok([p.prompt], add_special_tokens=False)["input_ids"][0])
    logits = model(jnp.asarray([ids[:-1]])).logits[0]
    lp = jax.nn.log_softmax(logits, axis=-1)[np.arange(len(ids) - 1), np.asarray(ids[1:])]
    want = float(jnp.mean(lp[n_prompt - 1 :]))
    assert float(out["loglik"][i]) == pytest.approx(want, abs=1e-4)
    assert float(out["min_k"][i]) <= float(out["loglik"][i]) + 1e-6


def test_evaluate_reports_every_detector(ctx):
  out = contamination_eval.evaluate(
    ctx,
    ctx.init_params,
    seen=os.path.join(DATA, "lara_seen.jsonl"),
    unseen=os.path.join(DATA, "lara_unseen.jsonl"),
    reference=os.path.join(DATA, "lara_reference.jsonl"),
  )
  for name in contamination_eval.DETECTORS:
    assert 0.0 <= out[f"{name}_auroc"] <= 1.0 and 0.0 <= out[f"{name}_tpr5"] <= 1.0
  best = max(out[f"{n}_auroc"] for n in contamination_eval.DETECTORS[1:])
  assert out["lara_auroc_minus_best_baseline"] == pytest.approx(out["lara_auroc"] - best)


def test_config_names_the_missing_file_and_an_env_without_variants(tmp_path):
  c = _config()
  c.eval.lara_seen = os.path.join(DATA, "lara_seen.jsonl")
  c.eval.lara_unseen = str(tmp_path / "nope.jsonl")
  c.eval.lara_reference = os.path.join(DATA, "lara_reference.jsonl")
  with pytest.raises(ConfigError, match="config.eval.lara_unseen=.*is no file"):
    validate(c)
  c.eval.lara_unseen = os.path.join(DATA, "lara_unseen.jsonl")
  validate(c)
  c.env.name = "chain"
  with pytest.raises(ConfigError, match="has no variants"):
    validate(c)
