"""The char_quota env (SAVE's toy): the verifier's rule, and wrong answers that are never too
long (the reward model's blind spot)."""

import jax
import numpy as np
import pytest

from posttrain_jax import envs
from posttrain_jax.train import preference_pairs as pairs_lib

ENV = envs.ENVS["char_quota"]


def test_verifier_rule_by_hand():
  p = ENV.make("a", 3, 6, 8)
  assert p.prompt == "a3:6=" and p.answer == "aaa"
  for text, want in (
    ("aaa", 1.0),
    (" abaca ", 1.0),
    ("aaaaaa", 1.0),
    ("aaaaaaa", 0.0),
    ("aab", 0.0),
    ("aaax", 0.0),
    ("", 0.0),
    ("bbbaaa", 1.0),
  ):
    assert ENV.verify(p, text) == want, text


@pytest.mark.parametrize("level", [3, 8])
def test_problems_answers_and_corpus(level):
  rng = np.random.default_rng(level)
  for split in envs.SPLITS:
    for p in ENV.sample(jax.random.key(level), 100, level=level, split=split):
      assert envs.split_of(p.uid, ENV.eval_percent) == split
      assert ENV.verify(p, p.answer) == 1.0 and ENV.rebuild(p) == p
      assert len(p.prompt) <= ENV.max_prompt_chars(level)
      assert ENV.verify(p, ENV.solution(p, rng)) == 1.0
      wrong = ENV.corrupt(p, rng)
      assert ENV.verify(p, wrong) == 0.0 and 1 <= len(wrong) <= p.data[2]
  noisy = ENV.corpus(jax.random.key(0), 400, level=level, noise=0.5)
  right = np.mean(
    [ENV.verify(ENV.rebuild(envs.Problem(q, "", "char_quota", level, q)), a) for q, a in noisy]
  )
  assert 0.35 < right < 0.65


def test_env_pairs_never_show_an_overlong_answer():
  pairs = pairs_lib.env_pairs(ENV, jax.random.key(0), 200, level=8, split="train")
  for prompt, rejected in zip(pairs.prompt, pairs.rejected):
    limit = int(prompt.removesuffix("=").split(":")[1])
    assert len(rejected) <= limit
