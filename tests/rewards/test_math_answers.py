"""rewards/math_answers.py: extraction of each answer form, math-verify equivalence (gold first),
hedging, answer tags, the time budget that composes with the reward workers' alarm, and a
hanging check that ends within the worker's timeout through the Scorer."""

import io
import pickle
import signal
import time

import pytest

from posttrain_jax import envs
from posttrain_jax.rewards import REWARDS, Scorer, calls, catalogue, math_answers, outcomes

HANG = r"so the answer is \boxed{9^{9^{9^{9}}}}"  # sympy computes the tower: a check that hangs


def _problem(answer: str) -> envs.Problem:
  return envs.Problem(prompt="q", answer=answer, env="math", level=0, uid=f"u:{answer}")


@pytest.mark.parametrize(
  "completion, answers",
  [
    (r"First 40, then \boxed{42}.", ["42"]),
    (r"\boxed{\frac{1}{2}} and again \fbox{ 0.5 }", [r"\frac{1}{2}", "0.5"]),
    (r"nested \boxed{\frac{a}{b^{2}}}", [r"\frac{a}{b^{2}}"]),
    (r"\boxed 7 is it", ["7"]),
    (r"unclosed \boxed{42", ["42"]),  # no box: the last number
    ("So the answer is 42.", ["42"]),
    ("The final answer is: $3.5$.\nThanks", ["3.5"]),
    ("The answer is 42, since 6*7=42.", ["42"]),
    ("The answer is 42 apples", ["42"]),
    ("The answer is 3 or 4", ["3 or 4"]),  # kept whole: a hedge
    ("the answer is 5 ... wait, the answer is 6", ["6"]),  # the last
    ("Natalia sold 48/2 = 24 clips.\n#### 72", ["72"]),
    ("#### 1,234", ["1,234"]),
    ("#### Step 2\nSo she has 12 apples.\n#### Result\n$12$ in all", ["12"]),  # headings
    ("Answer: -3", ["-3"]),
    ("**Answer:** 17", ["17"]),
    ("Final Answer: **73**", ["73"]),  # math-verify #76 picked 234 here
    ("The sum is 5-15 which gives -10", ["-10"]),
    ("x - 3 and 12,500 then 0.25", ["0.25"]),
    ("5-3", ["3"]),  # a difference, not -3
    ("no digits at all", []),
    ("", []),
    ("<think>It is 41.</think><answer>42</answer>", ["42"]),
    (r"<think>\boxed{41}</think> <answer>The answer is \boxed{42}</answer>", ["42"]),
    ("<think>42</think><answer></answer>", []),  # empty answer: nothing, not 42
    ("<answer>3</answer><answer>4</answer>", ["3", "4"]),
  ],
)
def test_extract_answers(completion, answers):
  assert math_answers.extract_answers(completion) == answers


def test_extraction_reads_the_tail_only():
  text = r"\boxed{41}" + " filler" * 400 + " the total is 42"
  assert math_answers.extract_answers(text) == ["42"]
  assert math_answers.extract_answers(text, tail=0) == ["41"]


@pytest.mark.parametrize(
  "gold, completion, score",
  [
    ("42", r"so \boxed{42}", 1.0),
    ("42", r"so \boxed{43}", 0.0),
    ("42", "The answer is 42.", 1.0),
    ("42", "The answer is 24.", 0.0),
    ("72", "48 + 24 = 72 clips.\n#### 72", 1.0),
    ("72", "48 + 24 = 72 clips.\n#### 70", 0.0),
    ("1234", "#### 1,234", 1.0),  # thousands separator
    ("1234", r"\boxed{1{,}234}", 1.0),
    ("1000", r"\boxed{1\,000}", 0.0),  # thin space: a known false negative
    ("17", "Answer: 17", 1.0),
    ("17", "Answer: 71", 0.0),
    ("42", "6 times 7 is 42", 1.0),  # last number
    ("42", "42 is 6 times 7", 0.0),
    ("1/2", r"\boxed{0.5}", 1.0),  # fractions, decimals, \frac
    ("0.5", r"\boxed{\frac{1}{2}}", 1.0),
    (r"\frac{1}{2}", "The answer is 1/2.", 1.0),
    (r"\dfrac{9}{7}", r"\boxed{9/7}", 1.0),  # a bare LaTeX gold parses
    ("1/2", r"\boxed{0.49}", 0.0),
    ("1/3", r"\boxed{0.333333}", 1.0),  # 6 digits: equal
    ("1/3", r"\boxed{0.33}", 0.0),
    ("-3", "Answer: -3", 1.0),  # negative numbers
    ("3", "Answer: -3", 0.0),
    ("-3", "Answer: 3", 0.0),
    ("(x+1)^2", r"\boxed{x^2+2x+1}", 1.0),  # simple expressions
    ("x+1", r"\boxed{1+x}", 1.0),
    (r"2\sqrt{2}", r"\boxed{\sqrt{8}}", 1.0),
    ("x+1", r"\boxed{x-1}", 0.0),
    ("5", r"\boxed{x = 5}", 1.0),  # gold first: a number accepts x = 5
    (r"10\%", r"\boxed{0.1}", 1.0),
    (r"\pi", r"\boxed{3.14}", 0.0),
    ("42", r"\boxed{41} or \boxed{42}", 0.0),  # hedged boxes
    ("42", r"\boxed{42}, i.e. \boxed{42.0}", 1.0),  # the same answer twice
    ("42", r"\boxed{41}. No wait: \boxed{42}", 0.0),  # a self-correction is a hedge too
    ("42", "The answer is 41 or 42", 0.0),  # a hedged set
    ("42", "<think>41?</think><answer>42</answer>", 1.0),
    ("42", "<think>so 42</think><answer></answer>", 0.0),  # empty answer exploit
    ("42", "<answer>41</answer><answer>42</answer>", 0.0),
    (r"\text{Evelyn}", r"\boxed{\text{Evelyn}}", 1.0),
    ("42", "I cannot tell", 0.0),
  ],
)
def test_check(gold, completion, score):
  assert math_answers.check(gold, completion) == score
  assert REWARDS["math"](_problem(gold), completion) == score
  assert math_answers.MathAnswer().verify(_problem(gold), completion) == score


def test_non_strings_and_blank_golds_score_zero():
  assert math_answers.check("42", None) == 0.0
  assert math_answers.check("42", b"42") == 0.0
  assert math_answers.check("  ", "42") == 0.0


def test_gold_first():
  """math-verify compares asymmetrically: a gold interval rejects a predicted inequality."""
  assert math_answers.equivalent("1<x<2", "(1,2)") is True
  assert math_answers.equivalent("(1,2)", "1<x<2") is False


def test_the_rule_pickles_and_resolves_by_name():
  rule = pickle.loads(pickle.dumps(math_answers.MathAnswer(tail=50, time_budget=2.0)))
  assert (rule.tail, rule.time_budget) == (50, 2.0)
  assert catalogue.resolve("math") is math_answers.math_reward
  assert (
    catalogue.resolve("posttrain_jax.rewards.math_answers:math_reward") is math_answers.math_reward
  )


class _Outer(BaseException):
  pass


def _raise_outer(signum, frame):
  raise _Outer()


@pytest.fixture
def outer_alarm():
  """The worker's setting: SIGALRM raises a BaseException; restored afterwards."""
  previous = signal.signal(signal.SIGALRM, _raise_outer)
  yield
  signal.setitimer(signal.ITIMER_REAL, 0)
  signal.signal(signal.SIGALRM, previous)


def test_budget_ends_a_hanging_check_and_restores_the_outer_alarm(outer_alarm):
  math_answers.check("1", r"\boxed{1}")  # math-verify imported and warm
  start = time.monotonic()
  signal.setitimer(signal.ITIMER_REAL, 1.5)
  with pytest.raises(_Outer):
    assert math_answers.check("1", HANG, time_budget=0.3) == 0.0
    assert signal.getsignal(signal.SIGALRM) is _raise_outer
    assert 0.7 < signal.getitimer(signal.ITIMER_REAL)[0] < 1.25  # the outer alarm, re-armed
    time.sleep(5)
  assert 1.4 < time.monotonic() - start < 2.5  # it fired when it was due


def test_an_outer_alarm_due_first_is_left_to_fire(outer_alarm):
  start = time.monotonic()
  signal.setitimer(signal.ITIMER_REAL, 0.3)
  with pytest.raises(_Outer):
    math_answers.check("1", HANG, time_budget=5.0)
  assert time.monotonic() - start < 1.5


def test_no_budget_outside_the_budget():
  assert math_answers.check("1", r"\boxed{1}", time_budget=None) == 1.0
  assert signal.getitimer(signal.ITIMER_REAL)[0] == 0.0


def test_a_hanging_check_ends_within_the_workers_timeout():
  """Through the Scorer (one worker, 2 s per call): with the default 5 s budget the worker's
  alarm ends the call (a counted timeout); with a 0.5 s budget it scores 0 as a wrong answer.
  The other calls are scored."""
  out = io.StringIO()
  scorer = Scorer(timeout=2.0, workers=1, max_error_rate=1.0, out=out)
  problems = [_problem("1"), _problem("1"), _problem("1")]
  texts = [r"\boxed{1}", r"\boxed{2}", HANG]
  warm = Scorer(timeout=60.0, workers=1, max_error_rate=1.0, out=io.StringIO())
  rule = math_answers.MathAnswer()
  assert warm.score(rule, problems[:1], texts[:1], env="math")[0].tolist() == [1.0]
  start = time.monotonic()
  rewards, codes = scorer.score(rule, problems, texts, env="math")
  assert time.monotonic() - start < 2.0 + calls.GRACE + 1.0
  assert rewards.tolist() == [1.0, 0.0, 0.0]
  assert codes.tolist() == [0, 0, outcomes.CODES["timeout"]]
  assert "failed (timeout) on problem 'u:1'" in out.getvalue()
  start = time.monotonic()
  rewards, codes = scorer.score(
    math_answers.MathAnswer(time_budget=0.5), problems, texts, env="math"
  )
  assert time.monotonic() - start < 2.0
  assert rewards.tolist() == [1.0, 0.0, 0.0] and codes.tolist() == [0, 0, 0]


@pytest.mark.parametrize(
  "gold, completion, score",
  [
    ("1000", r"\boxed{1\,000}", 0.0),  # the thin space reads as a product
    ("2", r"\boxed{\pm 2}", 0.0),
    (r"\pi", r"\boxed{3.14}", 0.0),
    (r"\sqrt{1/n}", r"\boxed{1/\sqrt{n}}", 0.0),
    ("1/2", r"so x = \frac{1}{2}", 0.0),  # no anchor: the last number, 2
    ("0.5", "The answer is one half.", 0.0),
    ("12", "The answer is 12:30", 0.0),
    ("9", r"\boxed{9\%}", 1.0),  # false positives
    ("1/2004!", r"\boxed{1/2006!}", 1.0),
    ("0.5772156649", r"\boxed{\gamma}", 1.0),
  ],
)
def test_known_false_negatives_and_positives(gold, completion, score):
  """docs/answer_checking.md's table of math-verify 0.9.0's known mistakes: a change here means
  the library changed, and the table needs updating."""
  assert math_answers.check(gold, completion) == score
