"""The reward_model stage (train/reward_model.py, train/preference_pairs.py): it learns a
preference (held-out pairwise accuracy far above chance), its saved model ranks a reference
answer above a wrong one through the reward term, a stopped stage resumes to the same result,
and bad pairs files give errors naming the line."""

import json
import os
import types

import jax
import numpy as np
import pytest
from flax import nnx

from posttrain_jax import defaults, envs, models
from posttrain_jax import io as ptio
from posttrain_jax import methods as methods_lib
from posttrain_jax.registry import ConfigError
from posttrain_jax.rewards import REWARDS, RunInfo
from posttrain_jax.train import placement as placement_lib
from posttrain_jax.train import preference_pairs as pairs_lib
from posttrain_jax.train import reward_model as stage_lib
from posttrain_jax.train import state as state_lib

STAGE = stage_lib.STAGE


def rm_config(**reward_model):
  """Nano model, arithmetic level 1, the reward_model stage only."""
  c = defaults.make_smoke(defaults.addition_base(0))
  c.stages = (STAGE,)
  c.progress = False
  c.env.level = 1
  c.reward_model.update(
    steps=40, batch_size=32, lr=1e-3, eval_every=20, checkpoint_every=20, pairs=512
  )
  c.reward_model.update(reward_model)
  return c


def read(path):
  with open(path, encoding="utf-8") as f:
    return json.load(f)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A reward model trained 40 steps on pairs made from the env (correct sum over a wrong
  one: the no-carry sum, or one digit changed)."""
  workdir = str(tmp_path_factory.mktemp("rm_trained"))
  methods_lib.run(rm_config(), workdir)
  return workdir


def test_stage_learns_the_preference(trained):
  done = read(os.path.join(trained, STAGE, "done.json"))
  # chance is 0.5; a loss of the wrong sign ends near 0, one that ignores the pair at 0.5
  assert done["eval/accuracy"] >= 0.85, done
  assert done["heldout_pairs"] == round(512 * 0.1) and done["steps"] == 40
  meta = read(os.path.join(trained, STAGE, "reward_model.json"))
  assert meta["mean"] == pytest.approx(done["eval/reward_mean"])
  assert meta["std"] == pytest.approx(done["eval/reward_std"]) and meta["std"] > 0
  assert meta["heldout_accuracy"] == pytest.approx(done["eval/accuracy"])
  records = ptio.read_jsonl(os.path.join(trained, STAGE, "metrics.jsonl"))
  assert [r["step"] for r in records] == list(range(1, 41))
  assert [r["step"] for r in records if "eval/accuracy" in r] == [20, 40]
  assert np.mean([r["loss/bt"] for r in records[-10:]]) < np.mean(
    [r["loss/bt"] for r in records[:10]]
  )


def test_term_ranks_a_right_answer_above_a_wrong_one(trained):
  env = envs.get_env("arithmetic")
  pairs = pairs_lib.env_pairs(env, envs_key(7), 64, level=1, split="eval")
  problems = [
    envs.Problem(prompt=p, answer=c, env="arithmetic", level=1, uid=p)
    for p, c in zip(pairs.prompt, pairs.chosen)
  ]
  run = RunInfo(workdir=trained)
  chosen = REWARDS["reward_model"](problems, list(pairs.chosen), run=run)
  rejected = REWARDS["reward_model"](problems, list(pairs.rejected), run=run)
  assert chosen.shape == rejected.shape == (len(problems),)
  assert np.mean(chosen > rejected) >= 0.85
  # normalised with the held-out statistics: scores of held-out texts are centred near 0
  both = np.concatenate([chosen, rejected])
  assert abs(float(both.mean())) < 0.5 and 0.5 < float(both.std()) < 2.0


def envs_key(seed):
  return jax.random.key(seed)


def write_pairs(path, n=24, seed=3):
  env = envs.get_env("arithmetic")
  pairs = pairs_lib.env_pairs(env, envs_key(seed), n, level=1, split="train")
  with open(path, "w", encoding="utf-8") as f:
    for p, c, r in zip(pairs.prompt, pairs.chosen, pairs.rejected):
      f.write(json.dumps({"prompt": p, "chosen": c, "rejected": r, "margin": 0.5}) + "\n")
  return str(path)


class _Stop(Exception):
  pass


def test_resume_after_a_stop_gives_the_same_model(trained, tmp_path, monkeypatch):
  """The fixture's config stopped after step 25 (checkpoint at 20), run again: steps 21..40
  and the final model are the uninterrupted run's."""
  stopped = str(tmp_path / "stopped")
  write = ptio.MetricWriter.write

  def stop_at_25(self, step, record):
    if step == 25:
      raise _Stop()
    return write(self, step, record)

  monkeypatch.setattr(ptio.MetricWriter, "write", stop_at_25)
  with pytest.raises(_Stop):
    methods_lib.run(rm_config(), stopped)
  assert not os.path.exists(os.path.join(stopped, STAGE, "done.json"))
  monkeypatch.setattr(ptio.MetricWriter, "write", write)
  methods_lib.run(rm_config(), stopped)  # resumes from the checkpoint of step 20
  a = ptio.read_jsonl(os.path.join(trained, STAGE, "metrics.jsonl"))
  b = ptio.read_jsonl(os.path.join(stopped, STAGE, "metrics.jsonl"))
  assert [r["step"] for r in b] == list(range(1, 41))
  for ra, rb in zip(a, b):
    assert ra["loss/bt"] == pytest.approx(rb["loss/bt"], rel=1e-5)
  pa = ptio.checkpoint.restore_params_single_device(os.path.join(trained, STAGE, "final"))
  pb = ptio.checkpoint.restore_params_single_device(os.path.join(stopped, STAGE, "final"))
  for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)
  done = read(os.path.join(stopped, STAGE, "done.json"))
  assert done["eval/accuracy"] == pytest.approx(
    read(os.path.join(trained, STAGE, "done.json"))["eval/accuracy"]
  )
  # a finished stage is skipped by a rerun
  methods_lib.run(rm_config(), stopped)
  assert read(os.path.join(stopped, STAGE, "done.json")) == done


def test_pairs_file_is_split_by_eval_fraction(tmp_path):
  data = write_pairs(tmp_path / "pairs.jsonl")
  c = rm_config(data=data, eval_fraction=0.25)
  ctx = types.SimpleNamespace(config=c, key=jax.random.key(0), env=None)
  train, held = stage_lib.load_pairs(ctx)
  assert (len(train), len(held)) == (18, 6)
  assert set(train.margin) == {0.5} and held.where[0].startswith(f"{data}:")
  c = rm_config(pairs=40, eval_fraction=0.25)  # made from the env: held out from its eval split
  ctx = types.SimpleNamespace(config=c, key=jax.random.key(0), env=envs.get_env("arithmetic"))
  train, held = stage_lib.load_pairs(ctx)
  assert len(held) == 10 and 25 <= len(train) <= 30
  assert all(envs.split_of(p, 10) == "eval" for p in held.prompt)
  assert all(envs.split_of(p, 10) == "train" for p in train.prompt)


@pytest.mark.parametrize(
  "line, problem",
  [
    ('{"prompt": "1+1=", "chosen": "2"}', r"missing field\(s\) \['rejected'\]"),
    ('{"prompt": "1+1=", "chosen": 2, "rejected": "3"}', "field 'chosen' must be a string"),
    (
      '{"prompt": "1+1=", "chosen": "2", "rejected": "3", "margin": "big"}',
      "'margin' must be a finite number",
    ),
    (
      '{"prompt": "1+1=", "chosen": "2", "rejected": "3", "margin": NaN}',
      "'margin' must be a finite number",
    ),
    ('["1+1=", "2", "3"]', "got a JSON list"),
    ('{"prompt": "1+1=", "chosen": "2", "rejected": ', "invalid JSON"),
  ],
)
def test_malformed_pairs_file_names_the_line(tmp_path, line, problem):
  path = tmp_path / "pairs.jsonl"
  good = '{"prompt": "1+1=", "chosen": "2", "rejected": "3"}'
  path.write_text(f"{good}\n\n{line}\n", encoding="utf-8")
  with pytest.raises(envs.DatasetError, match=f"^{path}:3: .*{problem}"):
    pairs_lib.read_pairs(str(path))


def test_missing_or_empty_pairs_file(tmp_path):
  missing = str(tmp_path / "nope.jsonl")
  with pytest.raises(ConfigError, match="config.reward_model.data=.*nope.jsonl.*no such file"):
    methods_lib.run(rm_config(data=missing), str(tmp_path / "run"))
  with pytest.raises(ConfigError, match="no such file"):
    pairs_lib.read_pairs(missing)
  empty = tmp_path / "empty.jsonl"
  empty.write_text("\n", encoding="utf-8")
  with pytest.raises(envs.DatasetError, match="no pairs"):
    pairs_lib.read_pairs(str(empty))


def test_pairs_the_tokenizer_cannot_read_name_the_line(tmp_path):
  path = tmp_path / "pairs.jsonl"
  path.write_text(
    '{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n'
    '{"prompt": "one plus one", "chosen": "two", "rejected": "3"}\n'
  )
  tok = models.build_char_tokenizer("0123456789+=")
  with pytest.raises(envs.DatasetError, match=f"{path}:2: .*does not know"):
    stage_lib.Encoded(pairs_lib.read_pairs(str(path)), tok, 16)


@pytest.mark.parametrize("name", ["arithmetic", "countdown", "digit_sum"])
def test_env_pairs_are_right_over_wrong(name):
  env = envs.get_env(name)
  level = env.levels[0]
  pairs = pairs_lib.env_pairs(env, envs_key(0), 32, level=level, split="train")
  assert len(pairs) >= 28  # a pair is dropped only when no wrong answer was found
  problems = env.sample(envs_key(0), 32, level=level, split="train")
  by_prompt = {p.prompt: p for p in problems}
  for prompt, chosen, rejected in zip(pairs.prompt, pairs.chosen, pairs.rejected):
    assert env.verify(by_prompt[prompt], chosen) == 1.0
    assert env.verify(by_prompt[prompt], rejected) < 1.0 and rejected != chosen


def test_split_pairs_holds_out_a_fraction():
  pairs = pairs_lib.Pairs(*(tuple(str(i) for i in range(10)),) * 3, (0.0,) * 10, ("x",) * 10)
  train, held = pairs_lib.split_pairs(pairs, 0.2, seed=0)
  assert len(held) == 2 and len(train) == 8
  assert sorted(train.prompt + held.prompt) == sorted(pairs.prompt)
  assert pairs_lib.split_pairs(pairs, 0.2, seed=0) == (train, held)  # seeded
  assert len(pairs_lib.split_pairs(pairs, 0.0, seed=0)[1]) == 0
  with pytest.raises(ConfigError, match="at least 2 pairs"):
    pairs_lib.split_pairs(pairs.take([0]), 0.1, seed=0)


def test_model_is_the_trunk_with_a_scalar_head():
  """The run's model: the given trunk's embedding, blocks and final norm, a new [D, 1] head;
  with reward_model.preset: a fresh model of that preset."""
  c = rm_config()
  tokenizer = models.build_char_tokenizer("0123456789+=")
  graphdef, init = state_lib.build_model(c.model, len(tokenizer), 0)
  ctx = types.SimpleNamespace(
    config=c,
    graphdef=graphdef,
    init_params=init,
    tokenizer=tokenizer,
    placement=placement_lib.Placement(placement_lib.mesh_from_config(None)),
  )
  trunk = jax.tree.map(lambda x: x + 1.0, init)
  graphdef, params = stage_lib.build_model(ctx, trunk)
  config = nnx.merge(graphdef, params).config
  assert config.output_dim == 1 and params["lm_head"].shape == (config.hidden_size, 1)
  assert 0.01 < float(np.std(np.asarray(params["lm_head"][...]))) < 0.04  # a fresh head
  for name in ("embed", "layers", "final_norm"):
    for x, y in zip(jax.tree.leaves(params[name]), jax.tree.leaves(trunk[name])):
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  c.reward_model.update(preset="tiny", overrides={"num_layers": 3})
  graphdef, params = stage_lib.build_model(ctx, init)
  config = nnx.merge(graphdef, params).config
  assert (config.hidden_size, config.num_layers, config.output_dim) == (128, 3, 1)


def test_rl_run_scores_rollouts_with_the_reward_model(tmp_path):
  """stages (reward_model, rl): a reward model trained from a pairs file is an RL reward term
  (config.reward.terms), logged as reward/reward_model beside the env's reward/correct."""
  pytest.importorskip(
    "posttrain_jax.rewards.terms",
    reason="config.reward.terms (rewards/terms.py) is not on this branch yet",
  )
  c = rm_config(
    data=write_pairs(tmp_path / "pairs.jsonl"),
    steps=4,
    batch_size=8,
    eval_every=4,
    eval_fraction=0.25,
  )
  c.stages = (STAGE, "rl")
  c.rl.update(steps=2, eval_every=0)
  c.reward.terms = {"reward_model": {"weight": 1.0, "kwargs": {"normalize": False}}}
  methods_lib.run(c, str(tmp_path / "run"))
  records = ptio.read_jsonl(str(tmp_path / "run" / "rl" / "metrics.jsonl"))
  assert [r["step"] for r in records if r["step"] > 0] == [1, 2]
  for r in (r for r in records if r["step"] > 0):
    assert r["reward/reward_model/errors"] == 0 and np.isfinite(r["reward/reward_model"])
    # weights 1 and 1: the total is the RM's mean plus the verifier's
    assert r["reward/mean"] == pytest.approx(
      r["reward/reward_model"] + r["reward/correct"], abs=1e-5
    )
    assert r["reward/std"] > 0  # raw RM scores differ between completions


def test_evaluate_against_numpy():
  """Held-out metrics with a stand-in score (the sequence length): accuracy, margin, loss and
  the mean / std over every chosen and rejected reward."""
  tok = models.build_char_tokenizer("0123456789+=")
  pairs = pairs_lib.Pairs(
    ("1+1=", "2+2=", "3+3="), ("2", "4", "66"), ("22", "4", "6"), (0.0, 0.5, 1.0), ("a", "b", "c")
  )
  data = stage_lib.Encoded(pairs, tok, 16)
  score = lambda params, tokens, lengths: lengths.astype(np.float32)
  got = stage_lib.evaluate(
    score, None, data, pad_id=0, max_len=16, center_coef=0.1, use_margin=True, prefix="x/"
  )
  rc, rr, m = np.array([6.0, 6.0, 7.0]), np.array([7.0, 6.0, 6.0]), np.array([0.0, 0.5, 1.0])
  loss = np.mean(np.log1p(np.exp(-(rc - rr - m)))) + 0.1 * np.mean((rc + rr) ** 2)
  both = np.concatenate([rc, rr])
  assert got == pytest.approx(
    {
      "x/loss": loss,
      "x/accuracy": 1 / 3,
      "x/margin": 0.0,
      "x/reward_mean": both.mean(),
      "x/reward_std": both.std(),
    }
  )
  assert (
    stage_lib.evaluate(
      score,
      None,
      stage_lib.Encoded(pairs.take([]), tok, 16),
      pad_id=0,
      max_len=16,
      center_coef=0.0,
      use_margin=False,
    )
    == {}
  )
