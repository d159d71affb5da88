"""envs.dynamic_sampling: DAPO's zero-signal filter with bounded refills."""

import zlib

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain_jax import envs
from posttrain_jax.envs import dynamic_sampling as ds


class Script:
  """A draw/score pair over a fixed stream of reward groups; records every call."""

  def __init__(self, stream):
    self.stream, self.pos, self.calls = list(stream), 0, []

  def draw(self, round_, n):
    self.calls.append((round_, n))
    out = list(range(self.pos, min(self.pos + n, len(self.stream))))
    self.pos += n
    return out

  def score(self, groups):
    return [self.stream[g] for g in groups]


def test_zero_signal_masks():
  r = np.array([[1, 1, 1], [0, 1, 0], [0, 0, 0], [0.5, 0.5, 0.5000001]])
  np.testing.assert_array_equal(ds.zero_signal(r), [True, False, True, False])
  np.testing.assert_array_equal(ds.zero_signal(r, atol=1e-3), [True, False, True, True])
  np.testing.assert_array_equal(ds.zero_signal([[1, 0], [1], []]), [False, True, True])


def test_keeps_only_groups_with_signal_and_refills():
  stream = [[1, 1], [0, 1], [0, 0], [1, 0], [1, 1], [0, 0], [0, 1], [1, 0], [0, 1]]
  s = Script(stream)
  out = ds.dynamic_sample(s.draw, s.score, target_groups=3, max_rounds=5)
  assert out.groups == [1, 3, 6]
  assert s.calls == [(0, 3), (1, 2), (2, 1), (3, 1)]
  assert out.stats == {
    "rounds": 4,
    "drawn": 7,
    "dropped": 4,
    "dropped_all_max": 2,
    "dropped_all_min": 2,
    "kept": 3,
    "short": 0,
    "keep_rate": 3 / 7,
  }
  assert all(not ds.zero_signal([r])[0] for r in out.rewards)


def test_round_bound_and_shortfall():
  s = Script([[1, 1, 1]] * 50)
  out = ds.dynamic_sample(s.draw, s.score, target_groups=4, max_rounds=3)
  assert out.groups == [] and out.stats["short"] == 4 and out.stats["rounds"] == 3
  assert len(s.calls) == 3 and out.stats["dropped_all_max"] == 12


def test_oversample_and_truncation():
  s = Script([[0, 1]] * 50)
  out = ds.dynamic_sample(s.draw, s.score, target_groups=4, max_rounds=2, oversample=2.5)
  assert s.calls == [(0, 10)] and out.groups == [0, 1, 2, 3] and out.stats["kept"] == 4


def test_rejects_bad_arguments():
  s = Script([[0, 1]])
  for kw in (
    {"target_groups": 0, "max_rounds": 1},
    {"target_groups": 1, "max_rounds": 0},
    {"target_groups": 1, "max_rounds": 1, "oversample": 0.5},
  ):
    with pytest.raises(ValueError):
      ds.dynamic_sample(s.draw, s.score, **kw)
  with pytest.raises(ValueError, match="reward groups"):
    ds.dynamic_sample(lambda r, n: [0, 1], lambda g: [[0, 1]], 2, 1)


@settings(max_examples=100, deadline=None)
@given(
  st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=1, max_size=4), min_size=1, max_size=60),
  st.integers(1, 8),
  st.integers(1, 5),
  st.floats(1.0, 3.0),
)
def test_properties(stream, target, rounds, oversample):
  s = Script(stream)
  out = ds.dynamic_sample(s.draw, s.score, target, rounds, oversample=oversample)
  assert len(s.calls) <= rounds and [r for r, _ in s.calls] == list(range(len(s.calls)))
  assert len(out.groups) <= target and out.stats["short"] == target - len(out.groups)
  assert not ds.zero_signal(out.rewards).any() if out.rewards else True
  assert out.groups == sorted(out.groups)
  expected = [g for g in range(min(s.pos, len(stream))) if not ds.zero_signal([stream[g]])[0]]
  assert out.groups == expected[:target]
  again = Script(stream)
  assert (
    ds.dynamic_sample(again.draw, again.score, target, rounds, oversample=oversample).groups
    == out.groups
  )


def test_with_an_env_and_a_noisy_policy():
  """Groups of G=4 completions from a policy that solves level-1 problems only sometimes."""
  env = envs.ENVS["tron:math"]
  key = jax.random.key(0)

  def draw(round_, n):
    return env.sample(jax.random.fold_in(key, round_), n, level=1, split="train")

  def score(problems):
    out = []
    for i, p in enumerate(problems):
      rng = np.random.default_rng(zlib.crc32(p.uid.encode()) + i)
      out.append([env.verify(p, p.answer if rng.random() < 0.5 else "?") for _ in range(4)])
    return out

  out = ds.dynamic_sample(draw, score, target_groups=16, max_rounds=6, oversample=1.5)
  assert len(out.groups) == 16 and out.stats["dropped"] > 0
  assert all(0 < sum(r) < 4 for r in out.rewards)
