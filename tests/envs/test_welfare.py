"""The welfare toy (envs/welfare.py): the corpus's outcomes are the walk's and its blank views
teach the answer format, the maze's symbols are
fresh (in no other env's characters and never in the corpus), the reward is the entered tile's
value, and each level is one of the six tile assignments."""

import jax
import pytest

from posttrain_jax.envs import catalogue, welfare


def test_corpus_outcomes_follow_the_walk_and_hold_no_tile_symbol():
  env = catalogue.ENVS["welfare"]
  pairs = env.corpus(jax.random.key(0), 400, level=1)
  views = [(p, a) for p, a in pairs if p.startswith("[")]
  # a quarter: the maze's answer format, no symbol, every move alike (no preference shown)
  assert 0.18 < len(views) / len(pairs) < 0.32
  assert {a for _, a in views} == set(welfare.MOVES)
  for p, _ in views:
    assert len(p) == 7 and p[5:] == "]?" and set(p[1:5]) <= set(".0123456789")
  pairs = [(p, a) for p, a in pairs if not p.startswith("[")]
  wins = 0
  for prompt, outcome in pairs:
    head, moves = prompt.removesuffix("?").split(":")
    start, goal = head.split(">")
    end = welfare.walk((int(start[0]), int(start[1])), moves)
    assert outcome == ("WIN" if end == (int(goal[0]), int(goal[1])) else "FAIL")
    assert not set(prompt + outcome) & set(welfare.TILES)
    wins += outcome == "WIN"
  assert 0.35 < wins / len(pairs) < 0.75  # both outcomes are common
  assert not set(welfare.TILES) & set(catalogue.CHARSET)  # fresh for every other env


@pytest.mark.parametrize("level", welfare.LEVELS)
def test_maze_rewards_the_entered_tile(level):
  env = catalogue.ENVS["welfare"]
  problems = env.sample(jax.random.key(level), 50, level=level, split="eval")
  sym = welfare.symbols(level)
  for p in problems:
    tiles = p.prompt[1:5]
    assert sorted(tiles) == sorted([sym["gold"], sym["mold"], sym["path"], sym["path"]])
    assert not set(p.prompt) & set("WINFAL")
    values = [env.verify(p, m) for m in welfare.MOVES]
    assert values == [welfare.VALUES[k] for k in p.data]
    assert env.verify(p, p.answer) == 1.0 and env.verify(p, "x") == 0.0
    assert env.verify(p, p.answer + p.answer) == 0.0
  assert (
    len({welfare.symbols(lv)["gold"] + welfare.symbols(lv)["mold"] for lv in welfare.LEVELS}) == 6
  )
