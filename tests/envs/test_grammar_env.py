"""The grammar env (CME's toy): its parser against hand-written sentences and an exhaustive
enumeration of short word strings, its corpus noise, and its samples."""

import itertools

import jax
import numpy as np
import pytest

from posttrain_jax import envs
from posttrain_jax.envs import grammar

ENV = envs.ENVS["grammar"]


def _problem(noun, verb, level):
  return ENV.make(noun, verb, level)


@pytest.mark.parametrize(
  "text,level,ok",
  [
    ("the cat runs.", 1, True),
    ("a cat runs.", 1, True),
    ("the cat runs", 1, False),  # no period
    ("cat runs.", 1, False),  # no determiner
    ("the the cat runs.", 1, False),  # a doubled word
    ("the big cat runs.", 1, False),  # adjectives from level 2
    ("the big cat runs.", 2, True),
    ("the cat runs the dog.", 2, False),  # an intransitive verb with an object
    ("the cat sees.", 2, False),  # a transitive verb without one
    ("the cat sees a red dog.", 2, True),
    ("the cat near a dog sees a red dog.", 2, False),  # prepositions from level 3
    ("the cat near a dog sees a red dog under the owl.", 3, True),
    ("the cat near a dog near the owl sees a dog.", 3, False),  # one PP per noun phrase
    ("the  cat runs.", 1, False),
    ("the cat runs .", 1, False),
  ],
)
def test_parse_hand_written(text, level, ok):
  verb = text.rstrip(".").split(" ")[-1] if ok and "sees" not in text else "sees"
  verb = "runs" if "runs" in text else verb
  assert ENV.verify(_problem("cat", verb, level), text) == float(ok)


def test_parse_accepts_exactly_the_grammar_on_all_short_strings():
  """Level 2, every string of 3 or 4 words: accepted iff it is DET N VI, DET ADJ N VI (4
  words cannot hold a transitive sentence, which needs 5)."""
  words = grammar.DET + grammar.ADJ + grammar.NOUNS + grammar.INTRANS + grammar.TRANS
  accepted = 0
  for n in (3, 4):
    for combo in itertools.product(words, repeat=n):
      parsed = grammar.parse(" ".join(combo) + ".", 2)
      expect = (
        combo[0] in grammar.DET
        and combo[-1] in grammar.INTRANS
        and combo[-2] in grammar.NOUNS
        and (n == 3 or combo[1] in grammar.ADJ)
      )
      assert (parsed is not None) == expect, combo
      accepted += parsed is not None
  assert accepted == 2 * 8 * 3 * (1 + 4)


@pytest.mark.parametrize("level", grammar.LEVELS)
def test_corpus_noise_and_samples(level):
  clean = ENV.corpus(jax.random.key(0), 300, level=level, noise=0.0)
  noisy = ENV.corpus(jax.random.key(0), 300, level=level, noise=0.3)
  score = lambda pairs: np.mean(
    [ENV.verify(ENV.rebuild(envs.base.Problem(p, "", "grammar", level, p)), a) for p, a in pairs]
  )
  assert score(clean) == 1.0
  assert 0.6 < score(noisy) < 0.8  # 30% corrupted, every corruption ungrammatical
  assert max(len(a) for _, a in noisy) <= ENV.max_answer_chars(level)
  assert all(set(a) <= set(ENV.chars) for _, a in noisy)
  problems = ENV.sample(jax.random.key(1), 20, level=level)
  assert all(ENV.verify(p, p.answer) == 1.0 for p in problems)
  rng = np.random.default_rng(0)
  assert len({ENV.sentence(problems[0], rng) for _ in range(50)}) > (1 if level == 1 else 5)
  with pytest.raises(ValueError, match="grammar level"):
    ENV.sample(jax.random.key(0), 1, level=7)
