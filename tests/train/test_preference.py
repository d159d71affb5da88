"""The preference stage (train/preference.py): pairs from a JSONL file or the env's verifier,
sequence log-probs of the completion only, the start as the frozen reference (the first step's
DPO loss is log 2 exactly), and pretrain -> preference -> eval from one config that raises the
chosen completions over the rejected ones."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from posttrain_jax import methods as methods_lib
from posttrain_jax.methods import validate
from posttrain_jax.registry import ConfigError
from posttrain_jax.sweeps import runner
from posttrain_jax.train import experiment, preference
from posttrain_jax.train import pretrain as pretrain_lib

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PAIRS = [
  (f"{a}+{b}=", str(a + b), str(a + b + 1 + (a * b) % 3))
  for a in range(10)
  for b in range(0, 10, 2)
]


def _config(source, **pref):
  c = runner.load_config_module(os.path.join(REPO, "experiments", "quickstart.py")).get_config(
    "smoke"
  )
  c.progress = False
  c.stages = ("pretrain", "preference", "eval")
  c.preference.update(
    dict(source=source, batch_size=10, epochs=4, lr=3e-3, beta=0.5, checkpoint_every=5), **pref
  )
  return c


@pytest.fixture(scope="module")
def dpo_run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("pref")
  data = str(tmp / "pairs.jsonl")
  with open(data, "w", encoding="utf-8") as f:
    for p, c, r in PAIRS:
      f.write(json.dumps({"prompt": p, "chosen": c, "rejected": r}) + "\n")
  workdir = tmp / "run"
  c = _config(data)
  return workdir, c, methods_lib.run(c, str(workdir))


def _records(workdir):
  path = workdir / "preference" / "metrics.jsonl"
  return [r for r in map(json.loads, open(path, encoding="utf-8")) if "loss/preference" in r]


def _logps(ctx, params, pairs, side):
  rows = pretrain_lib.tokenize_pairs(ctx.tokenizer, [(p, x[side]) for p, *x in pairs], 12)
  return preference.completion_logprobs(
    ctx.graphdef, params, jnp.asarray(rows["tokens"]), jnp.asarray(rows["loss_mask"]), False
  )


def test_completion_logprobs_sum_the_completion_and_eos_tokens_only(dpo_run):
  workdir, c, _ = dpo_run
  ctx = methods_lib.make_context(c, str(workdir))
  params = experiment.load_final(str(workdir), "pretrain")[0]
  logp, lengths = _logps(ctx, params, PAIRS[:4], 0)
  for i, (p, chosen, _) in enumerate(PAIRS[:4]):
    ids = ctx.tokenizer([p + chosen], add_special_tokens=False)["input_ids"][0]
    ids = ids + [ctx.tokenizer.eos_token_id]
    model = __import__("flax").nnx.merge(ctx.graphdef, params)
    logits = np.asarray(model(jnp.asarray([ids[:-1]])).logits[0], np.float64)
    lsm = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
    lsm -= logits.max(-1, keepdims=True)
    start = len(ctx.tokenizer([p], add_special_tokens=False)["input_ids"][0])
    expect = sum(lsm[t - 1, ids[t]] for t in range(start, len(ids)))
    assert lengths[i] == len(chosen) + 1
    np.testing.assert_allclose(float(logp[i]), expect, rtol=1e-4)


def test_the_start_is_the_reference_and_dpo_raises_chosen_over_rejected(dpo_run):
  workdir, c, _ = dpo_run
  recs = _records(workdir)
  assert len(recs) == 4 * 5  # 50 pairs, 10 a step, 4 passes
  # before the first update the policy is its reference: every margin is 0, the loss log 2
  assert recs[0]["pref/margin"] == pytest.approx(0.0, abs=1e-6)
  assert recs[0]["loss/preference"] == pytest.approx(np.log(2), abs=1e-6)
  assert recs[-1]["pref/margin"] > 1.0 and recs[-1]["pref/accuracy"] > 0.9
  assert np.mean([r["loss/preference"] for r in recs[-5:]]) < 0.5 * np.log(2)
  ctx = methods_lib.make_context(c, str(workdir))
  start = experiment.load_final(str(workdir), "pretrain")[0]
  tuned = experiment.load_final(str(workdir), "preference")[0]
  gap = lambda params: np.asarray(
    _logps(ctx, params, PAIRS, 0)[0] - _logps(ctx, params, PAIRS, 1)[0]
  )  # noqa: E731
  assert np.mean(gap(tuned) > gap(start)) > 0.9


def test_env_pairs_are_verified_and_the_loss_is_chosen_by_name(tmp_path):
  c = _config("env", pairs=16, loss="ipo")
  validate(c)
  ctx = methods_lib.make_context(c, str(tmp_path))
  pairs = preference.load_pairs(ctx, c.preference)
  assert 0 < len(pairs) <= 16
  problems = {
    p.prompt: p
    for p in ctx.env.sample(preference.data_key(ctx), 16, level=c.env.level, split="train")
  }
  for prompt, chosen, rejected in zip(pairs.prompt, pairs.chosen, pairs.rejected):
    assert (
      ctx.env.verify(problems[prompt], chosen) == 1.0 > ctx.env.verify(problems[prompt], rejected)
    )


@pytest.mark.parametrize(
  "update, message",
  [
    (
      dict(loss="orpo"),
      "config.preference.loss='orpo' is unknown; valid names: dpo, ipo, kto, simpo",
    ),
    (
      dict(loss_kwargs=dict(gamma=1.0)),
      r"config.preference.loss_kwargs has unknown argument\(s\) \['gamma'\]",
    ),
    (dict(schedule="linear"), "config.preference.schedule='linear' is unknown"),
  ],
)
def test_bad_preference_settings_are_refused_with_the_fix(update, message):
  c = _config("env", **update)
  with pytest.raises(ConfigError, match=message):
    validate(c)


def test_a_missing_pairs_file_names_the_setting(tmp_path):
  c = _config(str(tmp_path / "none.jsonl"))
  with pytest.raises(ConfigError, match=r"config.preference.source='.*none.jsonl': no such file"):
    methods_lib.run(c, str(tmp_path / "w"))
