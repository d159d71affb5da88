"""The evaluator's diversity metric: distinct correct completions per problem."""

import numpy as np

from posttrain_jax.train import evaluate


def test_distinct_correct_counts_distinct_texts_that_scored():
  scores = np.array([1, 1, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1], np.float32)
  texts = ["ab", "ab ", "xx", "ac", "a", "b", "c", "d", "1", "2", "3", "4"]
  # problem 0: {"ab", "ac"} (a repeat and a wrong one do not count); 1: none; 2: four
  assert evaluate.distinct_correct(scores, texts, 4) == (2 + 0 + 4) / 3
  assert evaluate.distinct_correct(scores[:0], [], 4) == 0.0
