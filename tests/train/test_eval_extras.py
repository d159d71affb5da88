"""The eval stage's general-text loss (eval.lm_loss_examples: the held-out pretraining corpus's
NLL before and after the evaluated stage) and its gains (after minus before)."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posttrain_jax import methods as methods_lib
from posttrain_jax.sweeps import runner
from posttrain_jax.train import context as context_lib
from posttrain_jax.train import eval_stage, experiment, pretrain, updates

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  c = runner.load_config_module(os.path.join(REPO, "experiments", "quickstart.py")).get_config(
    "smoke"
  )
  c.progress = False
  c.stages = ("pretrain", "sft", "eval")
  c.sft.update(source="env", examples=32, batch_size=8, epochs=4, lr=3e-3)
  c.eval.lm_loss_examples = 16
  workdir = str(tmp_path_factory.mktemp("evx") / "run")
  return c, workdir, methods_lib.run(c, workdir)


def test_lm_loss_is_the_corpus_nll_of_the_evaluated_parameters(run):
  c, workdir, summary = run
  ctx = methods_lib.make_context(c, workdir)
  key = jax.random.fold_in(ctx.eval_key, 17)
  pairs = ctx.env.corpus(key, 16, level=c.env.level, noise=float(c.pretrain.corpus_noise))
  pairs = [(context_lib.prompt_text(ctx.tokenizer, p, ctx.chat_template), x) for p, x in pairs]
  rows = pretrain.tokenize_pairs(ctx.tokenizer, pairs, 32)
  for stage, name in (("pretrain", "before_rl"), ("sft", "after_rl")):
    params = experiment.load_final(workdir, stage)[0]
    nll = updates.supervised_nll(
      ctx.graphdef, params, jnp.asarray(rows["tokens"]), jnp.asarray(rows["loss_mask"])
    )
    assert summary[f"lm_loss_{name}"] == pytest.approx(float(nll), rel=1e-5)
  assert summary["lm_loss_after_rl"] != summary["lm_loss_before_rl"]
  assert eval_stage.lm_loss_fn(ctx) is not None


def test_gains_are_after_minus_before(run):
  _, workdir, summary = run
  for m in ("accuracy", "pass_at_1", "pass_at_k"):
    assert summary[f"{m}_gain"] == pytest.approx(
      summary[f"{m}_after_rl"] - summary[f"{m}_before_rl"]
    )
  stored = json.load(open(os.path.join(workdir, "summary.json"), encoding="utf-8"))
  assert np.isfinite(stored["lm_loss_after_rl"])
