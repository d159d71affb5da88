"""envs/chain.py: step-by-step chains modulo 10 (DenoiseRL's toy)."""

import itertools

import jax
import numpy as np
import pytest

from posttrain_jax import envs
from posttrain_jax.envs import chain

ENV = envs.ENVS["chain"]


def _value(start, ops):
  """Left to right with Python's own operators, then modulo 10: an independent evaluation."""
  v = start
  for op, d in ops:
    v = eval(f"({v}){op}({d})") % 10  # noqa: S307 (digits and + - * only)
  return v


def test_answers_equal_an_independent_evaluation_exhaustively_at_level_2():
  for start, (o1, d1), (o2, d2) in itertools.product(
    range(10), itertools.product(chain.OPS, range(10)), itertools.product(chain.OPS, range(10))
  ):
    p = ENV.make(start, ((o1, d1), (o2, d2)))
    assert p.answer == str(_value(start, ((o1, d1), (o2, d2))))


def test_reference_writes_each_step_and_verifies():
  p = ENV.make(7, (("+", 5), ("*", 3), ("-", 9)))
  assert p.prompt == "7+5*3-9=" and p.answer == "7"
  assert ENV.reference(p) == "7+5=2;2*3=6;6-9=7;#7"
  assert ENV.verify(p, ENV.reference(p)) == 1.0
  assert ENV.rebuild(envs.Problem(p.prompt, "", "chain", 3, p.prompt)) == p


def test_verify_reads_only_the_text_after_the_last_answer_mark():
  p = ENV.make(7, (("+", 5), ("*", 3), ("-", 9)))
  assert ENV.verify(p, "7+5=3;3*3=9;9-9=0;#0") == 0.0
  assert ENV.verify(p, "7+5=3;#0 7+5=2;2*3=6;6-9=7;#7") == 1.0  # a corrected restart
  assert ENV.verify(p, "7+5=2;2*3=6;6-9=7;#7 #0") == 0.0  # a later answer wins
  assert ENV.verify(p, "2*3=6;6-9=7") == 0.0  # no answer mark
  assert ENV.verify(p, None) == 0.0


def test_a_wrong_step_is_carried_to_a_wrong_answer():
  p = ENV.make(7, (("+", 5), ("*", 3), ("-", 9)))
  t = ENV.transcript(p, wrong_step=0, wrong_digit=1)
  assert t == "7+5=3;3*3=9;9-9=0;#0" and ENV.verify(p, t) == 0.0
  rng = np.random.default_rng(0)
  for problem in ENV.sample(jax.random.key(0), 50, level=4):
    true_steps = ENV.reference(problem).split(";")
    for step in range(4):
      for digit in range(1, 10):  # the wrong step's own result is wrong
        assert ENV.transcript(problem, step, digit).split(";")[step] != true_steps[step]
    assert ENV.verify(problem, ENV.wrong_transcript(problem, rng)) == 0.0
  # *0 at the end undoes any earlier error: only a last-step error is carried.
  p = ENV.make(3, (("+", 4), ("*", 0)))
  assert ENV.verify(p, ENV.transcript(p, 0, 2)) == 1.0
  assert all(ENV.wrong_transcript(p, rng).split(";")[1] != "7*0=0" for _ in range(20))


def test_a_corrected_slip_redoes_the_step_and_ends_right():
  p = ENV.make(7, (("+", 5), ("*", 3), ("-", 9)))
  t = ENV.transcript(p, wrong_step=0, wrong_digit=1, corrected=True)
  assert t == "7+5=3;!7+5=2;2*3=6;6-9=7;#7" and ENV.verify(p, t) == 1.0
  pairs = chain.Chain(correction=0.5).corpus(jax.random.key(4), 1000, level=4, noise=0.0)
  corrected = np.mean(["!" in y for _, y in pairs])
  assert 0.45 < corrected < 0.55
  assert not any(
    "!" in y
    for _, y in chain.Chain(correction=0.0).corpus(jax.random.key(4), 200, level=4, noise=0.0)
  )


def test_corpus_noise_is_the_fraction_of_wrong_transcripts():
  pairs = ENV.corpus(jax.random.key(3), 2000, level=5, noise=0.3)
  problems = {p.prompt: p for p in ENV.sample(jax.random.key(3), 2000, level=5)}
  wrong = np.mean([ENV.verify(problems[x], y) == 0.0 for x, y in pairs])
  assert 0.26 < wrong < 0.34
  assert all(
    ENV.verify(problems[x], y) == 1.0
    for x, y in ENV.corpus(jax.random.key(3), 200, level=5, noise=0.0)
  )
  # Of the others, a fraction `correction` (0.1 by default) show a corrected slip.
  corrected = np.mean(["!" in y for x, y in pairs if ENV.verify(problems[x], y) == 1.0])
  assert 0.06 < corrected < 0.14


def test_bad_prompts_and_problems_are_refused():
  for bad in ("7+=", "7x5=", "75=", "+5="):
    with pytest.raises(ValueError, match="not a chain prompt"):
      chain.parse_prompt(bad)
  with pytest.raises(ValueError, match="needs a digit"):
    ENV.make(12, (("+", 1), ("+", 2)))
  with pytest.raises(ValueError, match="level"):
    ENV.sample(jax.random.key(0), 1, level=9)


def test_trace_styles_share_the_answer_and_differ_only_in_length():
  steps, answer, checked = (envs.ENVS[n] for n in ("chain", "chain_answer", "chain_checked"))
  key = jax.random.key(3)
  for level in (2, 5):
    a, b, c = (e.corpus(key, 40, level=level) for e in (steps, answer, checked))
    for (p, s), (pb, t_answer), (pc, t_checked) in zip(a, b, c):
      assert p == pb == pc  # one key: the same problems in every style
      problem = steps.make(*chain.parse_prompt(p))
      body, _, value = s.rpartition(chain.ANSWER)
      assert t_answer == f"#{value}" and t_checked == body + body + f"#{value}"
      for e, t in ((steps, s), (answer, t_answer), (checked, t_checked)):
        assert e.verify(problem, t) == steps.verify(problem, s)
        assert len(t) <= e.max_answer_chars(level) + 7 * (t.count(chain.REDO))
  with pytest.raises(ValueError, match="chain trace 'long' is not one of"):
    chain.Chain(trace="long")
