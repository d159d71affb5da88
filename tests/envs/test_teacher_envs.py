"""The teacher papers' envs: graph_path (paths, feedback), digit_sum (many answers) and the
arithmetic feedback of the OPSD law, checked against brute force and hand-built cases."""

import itertools

import jax
import numpy as np
import pytest

from posttrain_jax import envs
from posttrain_jax.envs import diagnostics as diag
from posttrain_jax.envs import graph_path as graph_lib

GRAPH = envs.ENVS["graph_path"]
DIGITS = envs.ENVS["digit_sum"]
ARITH = envs.ENVS["arithmetic"]
# a->b->d (shortest, 2 steps), a->c->e->d and a->b->c->e->d are longer; max_steps = 3.
EDGES = [("a", "b"), ("a", "c"), ("b", "d"), ("c", "e"), ("e", "d"), ("b", "c"), ("d", "a")]


def _hand_graph():
  return GRAPH.make(EDGES, "a", "d", 1)


@pytest.mark.parametrize(
  "env,level", [(GRAPH, 1), (GRAPH, 3), (GRAPH, 5), (DIGITS, 3), (DIGITS, 8)]
)
def test_interface(env, level):
  train = env.sample(jax.random.key(level), 200, level=level, split="train")
  evals = env.sample(jax.random.key(level), 20, level=level, split="eval")
  assert not {p.uid for p in train} & {p.uid for p in evals}
  assert [p.uid for p in train] == [
    p.uid for p in env.sample(jax.random.key(level), 200, level=level, split="train")
  ]
  for p in train + evals:
    assert env.verify(p, p.answer) == 1.0 and env.verify(p, f" {p.answer}\n") == 1.0
    assert env.verify(p, p.answer + p.answer[-1]) == 0.0
    assert len(p.prompt) <= env.max_prompt_chars(level)
    assert len(p.answer) <= env.max_answer_chars(level)
    assert set(p.prompt + p.answer) <= set(env.chars)
    assert env.rebuild(p) == p
    assert env.rebuild(envs.Problem(p.prompt, "", env.name, level, p.uid)) == p
  assert all(
    env.verify(p, c)
    for p, (_, c) in zip(train, env.corpus(jax.random.key(level), 200, level=level))
  )
  rows = env.corpus(jax.random.key(level), 200, level=level, noise=1.0)
  assert not any(env.verify(p, c) for p, (_, c) in zip(train, rows))
  with pytest.raises(ValueError, match="level"):
    env.sample(jax.random.key(0), 1, level=max(env.levels) + 1)


@pytest.mark.parametrize("env", [GRAPH, DIGITS], ids=lambda e: e.name)
def test_substrate_diagnostics(env):
  """The TRON substrate checks: every generator call valid, malformed text scores 0."""
  for level, stats in diag.generation_reliability(env, seeds=range(2), n=10).items():
    assert stats["reliability"] == 1.0 and stats["call_failures"] == 0, (level, stats)
  c = diag.verifier_consistency(env, env.levels[-1], n=40)
  assert (c["own"], c["malformed"], c["raised"]) == (1.0, 0.0, 0)
  assert c["perturbed"] < 0.5  # several answers are correct: a perturbation can stay one


def test_graph_prompt_answer_and_verify_by_hand():
  p = _hand_graph()
  assert p.prompt == "ab ac bc bd ce da ed:ad=" and p.answer == "abd"
  assert p.data[3] == 3  # shortest path + one step
  assert GRAPH.verify(p, "abd") == 1.0
  assert GRAPH.verify(p, "aced") == 1.0  # 3 steps: within max_steps
  assert GRAPH.verify(p, "abced") == 0.0  # 4 steps: over max_steps
  for bad in (
    "ad",
    "acd",
    "bd",
    "ab",
    "abda",
    "abdab",
    "abdad",
    "",
    "a",
    "ab-d",
    "ABD",
    "abcbd",
    "abd\x00",
  ):
    assert GRAPH.verify(p, bad) == 0.0, bad
  assert GRAPH.solutions(p) == ["abd", "aced"] and GRAPH.num_solutions(p) == 2


def test_graph_feedback_by_hand():
  p = _hand_graph()
  cases = {
    "abd": "OK",
    "ad": "ad!ab",  # no edge a->d; take a->b (on the shortest way)
    "acd": "cd!ce",  # no edge c->d; from c the way on is c->e
    "b": "b!a",  # wrong start
    "": "!a",
    "ab": "b!bd",  # stops short at b
    "abda": "da!d",  # ran past the target
    "abc": "bc!bd",  # b->c is an edge but d is out of reach within 3 steps from there
    "acea": "ea!ed",  # no edge e->a
    "ace": "e!ed",
    "axd": "a-!ab",  # x names no node
    "abca": "bc!bd",
  }
  for attempt, expected in cases.items():
    assert GRAPH.feedback(p, attempt) == expected, attempt


@pytest.mark.parametrize("level", [1, 3, 5])
def test_graph_feedback_finds_the_first_invalid_step_and_a_valid_alternative(level):
  """A prefix of an attempt is valid iff some correct path starts with it: the feedback's bad
  step is where the longest valid prefix ends, and its fix is an edge from there that starts a
  shortest correct continuation."""
  rng = np.random.default_rng(level)
  for p in GRAPH.sample(jax.random.key(7), 60, level=level):
    edges, start, target, _ = p.data
    solutions = GRAPH.solutions(p)
    prefixes = {s[:i] for s in solutions for i in range(1, len(s) + 1)}
    for _ in range(4):
      attempt = GRAPH.corrupt(p, rng)
      assert GRAPH.verify(p, attempt) == 0.0
      bad, _, fix = GRAPH.feedback(p, attempt).partition("!")
      valid = max(i for i in range(len(attempt) + 1) if i == 0 or attempt[:i] in prefixes)
      if valid == 0:  # wrong start
        assert (bad, fix) == (attempt[:1], start)
        continue
      assert bad == attempt[valid - 1 : valid + 1]
      if attempt[:valid] in solutions:  # reached the target, then went on
        assert fix == target
        continue
      assert fix[0] == attempt[valid - 1] and tuple(fix) in set(edges)
      shortest = min((s for s in solutions if s.startswith(attempt[:valid])), key=len)
      assert any(
        s.startswith(attempt[:valid] + fix[1]) and len(s) == len(shortest) for s in solutions
      ), (attempt, fix)


@pytest.mark.parametrize("level", [1, 2])
def test_graph_solutions_match_brute_force(level):
  nodes = graph_lib.NODES[: graph_lib.num_nodes(level)]
  for p in GRAPH.sample(jax.random.key(11), 8, level=level):
    _, start, _, max_steps = p.data
    found = {
      start + "".join(rest)
      for n in range(1, max_steps + 1)
      for rest in itertools.product(nodes, repeat=n)
      if GRAPH.verify(p, start + "".join(rest))
    }
    assert sorted(found) == GRAPH.solutions(p)
    assert p.answer in found and len(p.answer) == min(len(s) for s in found)


def test_graph_difficulty_matches_the_docstring():
  """The random walker's success falls with the level (numbers in graph_path's docstring)."""
  rates = [GRAPH.random_walk_success(jax.random.key(0), 300, level=lvl) for lvl in GRAPH.levels]
  assert all(a > b for a, b in zip(rates, rates[1:])), rates
  assert 0.3 < rates[2] < 0.7  # the default level 3 leaves headroom both ways


def test_graph_problems_are_canonical_and_corrupt_is_deterministic():
  p = _hand_graph()
  assert GRAPH.make(list(reversed(EDGES)), "a", "d", 1) == p
  with pytest.raises(ValueError, match="cannot be reached"):
    GRAPH.make([("a", "b")], "b", "a", 1)
  with pytest.raises(ValueError, match="outside"):
    GRAPH.rebuild(envs.Problem("ab az:az=", "", "graph_path", 1, "u"))
  assert GRAPH.corrupt(p, np.random.default_rng(3)) == GRAPH.corrupt(p, np.random.default_rng(3))


def test_digit_sum_by_hand():
  p = DIGITS.make(4, 17, 5)
  assert p.prompt == "4:17=" and p.answer == "9800"
  for ok in ("9800", "4517", "0089", " 1277 "):
    assert DIGITS.verify(p, ok) == 1.0, ok
  for bad in ("980", "98000", "4518", "45a7", "４517", "-4517", "", "17"):
    assert DIGITS.verify(p, bad) == 0.0, bad


@pytest.mark.parametrize("n", [2, 3, 4])
def test_digit_sum_solutions_match_brute_force(n):
  by_sum = {}
  for digits in itertools.product("0123456789", repeat=n):
    by_sum.setdefault(sum(map(int, digits)), []).append("".join(digits))
  for total in range(1, 9 * n):
    p = DIGITS.make(n, total, 8)
    assert DIGITS.num_solutions(p) == len(by_sum[total])
    if n < 4:
      assert DIGITS.solutions(p) == sorted(by_sum[total])


def test_digit_sum_corpus_is_uniform_over_answers():
  p = DIGITS.make(2, 3, 3)  # 03, 12, 21, 30
  rng = np.random.default_rng(0)
  draws = [DIGITS.uniform_solution(p, rng) for _ in range(4000)]
  counts = np.array([draws.count(s) for s in ("03", "12", "21", "30")])
  assert counts.sum() == 4000 and np.all(np.abs(counts - 1000) < 4 * np.sqrt(4000 * 0.25 * 0.75))
  rows = DIGITS.corpus(jax.random.key(0), 300, level=5)
  answers = {}
  for prompt, completion in rows:
    answers.setdefault(prompt, set()).add(completion)
  repeated = [a for a in answers.values() if len(a) > 1]
  assert repeated  # a prompt seen twice is mostly answered two ways: the corpus shows diversity
  with pytest.raises(ValueError, match="over limit"):
    DIGITS.solutions(DIGITS.make(8, 36, 8))


def test_arithmetic_corrupt_is_wrong_and_plausible():
  rng = np.random.default_rng(0)
  for p in ARITH.sample(jax.random.key(0), 300, level=3):
    attempt = ARITH.corrupt(p, rng)
    a, b = p.data
    assert ARITH.verify(p, attempt) == 0.0 and attempt.isdigit()
    assert attempt in (ARITH.no_carry_sum(a, b),) or (
      len(attempt) == len(p.answer) and sum(x != y for x, y in zip(attempt, p.answer)) == 1
    )


def test_arithmetic_feedback_is_exact():
  rng = np.random.default_rng(1)
  for p in ARITH.sample(jax.random.key(3), 200, level=4):
    for attempt in (ARITH.corrupt(p, rng), p.answer[:-1], p.answer + "7", p.answer):
      note = ARITH.feedback(p, attempt)
      if attempt == p.answer:
        assert note == "OK"
        continue
      bad, _, fix = note.partition("!")
      i = len(bad) - 1  # the first place the attempt departs from the answer
      assert attempt.startswith(bad) and p.answer.startswith(fix)
      assert bad[:i] == fix[:i] and (bad[i:] != fix[i:])
      assert (
        len(bad) == len(fix)  # a wrong digit
        or (len(fix) == len(bad) + 1 and bad == attempt)  # one too few
        or (len(bad) == len(fix) + 1 and fix == p.answer)
      )  # one too many
