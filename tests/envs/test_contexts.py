"""Privileged contexts (envs/contexts.py): exact strings, informativeness, the corpus that teaches
a model to read them, and the characters they add to a run's tokenizer."""

import dataclasses

import jax
import numpy as np
import pytest

from posttrain_jax import envs
from posttrain_jax.envs import contexts
from posttrain_jax.registry import ConfigError

ARITH = envs.ENVS["arithmetic"]
GRAPH = envs.ENVS["graph_path"]
DIGITS = envs.ENVS["digit_sum"]
P = ARITH.make(123, 456, 3)  # 579


def _rng(seed=0):
  return np.random.default_rng(seed)


def test_each_context_on_an_addition():
  assert contexts.CONTEXTS["none"](ARITH, P, None, _rng()) == ""
  assert contexts.teacher_prompt(ARITH, P, None, _rng(), "none") == "123+456="
  assert contexts.teacher_prompt(ARITH, P, None, _rng(), "answer") == "579|123+456="
  # Hints cover the answer zero-padded to level + 1 digits: k = 0 shows none, k = 4 all.
  assert contexts.teacher_prompt(ARITH, P, None, _rng(), "hint_digits", k=0) == "----|123+456="
  assert contexts.teacher_prompt(ARITH, P, None, _rng(), "hint_digits", k=4) == "0579|123+456="
  assert contexts.teacher_prompt(ARITH, P, None, _rng(), "hint_digits", k=9) == "0579|123+456="
  for seed in range(20):
    hint = contexts.hint_digits(ARITH, P, None, _rng(seed), k=2)
    assert len(hint) == 4 and hint.count("-") == 2
    assert all(h in ("-", d) for h, d in zip(hint, "0579"))
  wrong = contexts.hint_digits(ARITH, P, None, _rng(), k=4, noise=1.0)
  assert all(h != d and h.isdigit() for h, d in zip(wrong, "0579"))
  # Feedback: the attempt up to its first wrong character, then the true sum up to there.
  cases = {
    "569": "56!57",
    "579": "OK",
    " 579\n": "OK",
    "57": "57!579",
    "5790": "5790!579",
    "5x9": "5-!57",
    "": "!5",
    "679": "6!5",
    "0579": "0!5",
  }
  for attempt, expected in cases.items():
    assert contexts.teacher_prompt(ARITH, P, attempt, _rng(), "feedback") == (
      expected + "|123+456="
    ), attempt


def test_feedback_on_a_path():
  g = GRAPH.make([("a", "b"), ("a", "c"), ("b", "d"), ("c", "e"), ("e", "d")], "a", "d", 1)
  assert g.answer == "abd" and g.prompt == "ab ac bd ce ed:ad="
  assert contexts.teacher_prompt(GRAPH, g, "ad", _rng(), "feedback") == "ad!ab|ab ac bd ce ed:ad="
  assert contexts.feedback(GRAPH, g, "abd", _rng()) == "OK"


def test_contexts_never_touch_the_students_prompt():
  problems = ARITH.sample(jax.random.key(0), 50, level=3)
  before = [dataclasses.replace(p) for p in problems]
  rng = _rng()
  for p in problems:
    for name, kwargs in (("answer", {}), ("hint_digits", {"k": 2, "noise": 0.5}), ("feedback", {})):
      text = contexts.teacher_prompt(ARITH, p, ARITH.corrupt(p, rng), rng, name, **kwargs)
      assert text.endswith("|" + p.prompt) and "|" not in p.prompt
  assert problems == before


def test_k_zero_reveals_nothing_and_k_n_everything():
  problems = ARITH.sample(jax.random.key(1), 300, level=3)
  rng = _rng()
  assert {contexts.hint_digits(ARITH, p, None, rng, k=0) for p in problems} == {"----"}
  assert all(int(contexts.hint_digits(ARITH, p, None, rng, k=4)) == sum(p.data) for p in problems)
  # In between, each k reveals exactly k digits, all of them true without noise.
  for k in (1, 2, 3):
    for p in problems[:50]:
      hint = contexts.hint_digits(ARITH, p, None, rng, k=k)
      target = p.answer.zfill(4)
      assert sum(h != "-" for h in hint) == k and all(h in ("-", t) for h, t in zip(hint, target))
  # digit_sum answers are digit strings of the prompt's length n: no padding.
  q = DIGITS.make(3, 20, 5)
  assert contexts.hint_digits(DIGITS, q, None, rng, k=3) == q.answer == "992"


@pytest.mark.parametrize("noise", [0.1, 0.3])
def test_noisy_hints_flip_digits_at_the_given_rate(noise):
  problems = ARITH.sample(jax.random.key(2), 2000, level=3)
  rng = _rng(3)
  flipped, total = 0, 0
  for p in problems:
    hint = contexts.hint_digits(ARITH, p, None, rng, k=4, noise=noise)
    flips = [h != t for h, t in zip(hint, p.answer.zfill(4))]
    flipped, total = flipped + sum(flips), total + len(flips)
  sd = np.sqrt(noise * (1 - noise) / total)
  assert abs(flipped / total - noise) < 4 * sd


def test_bad_configs_name_the_fix():
  with pytest.raises(ConfigError, match="valid context names: answer, feedback, hint_digits"):
    contexts.teacher_prompt(ARITH, P, None, _rng(), "hints")
  countdown = envs.ENVS["countdown"]
  q = countdown.sample(jax.random.key(0), 1, level=3)[0]
  with pytest.raises(ConfigError, match="envs with feedback: arithmetic, graph_path"):
    contexts.teacher_prompt(countdown, q, "1+2", _rng(), "feedback")
  with pytest.raises(ConfigError, match="envs with feedback: arithmetic, graph_path"):
    contexts.max_context_chars(countdown, 3, "feedback")
  with pytest.raises(ConfigError, match="answers are digits"):
    contexts.teacher_prompt(countdown, q, None, _rng(), "hint_digits", k=1)
  with pytest.raises(ConfigError, match="answers are digits"):
    contexts.max_context_chars(countdown, 3, "hint_digits", k=1)
  with pytest.raises(ConfigError, match="keyword arguments"):
    contexts.check_context(ARITH, 3, "hint_digits", k=1, nosie=0.1)
  with pytest.raises(ConfigError, match="keyword arguments"):
    contexts.check_context(ARITH, 3, "hint_digits")
  contexts.check_context(ARITH, 3, "hint_digits", k=1, noise=0.1)
  with pytest.raises(ConfigError, match="k >= 0"):
    contexts.hint_digits(ARITH, P, None, _rng(), k=-2)
  with pytest.raises(ValueError, match="pass it"):
    contexts.teacher_prompt(ARITH, P, None, _rng(), "feedback")
  bool_env = envs.ENVS["tron/bool"]  # its formulas use '|', the context delimiter
  with pytest.raises(ConfigError, match="ends a privileged context"):
    contexts.teacher_prompt(
      bool_env, bool_env.sample(jax.random.key(0), 1, level=1)[0], None, _rng(), "answer"
    )


CASES = [
  (ARITH, 3, "answer", {}),
  (ARITH, 3, "hint_digits", {"k": 2, "noise": 0.2}),
  (ARITH, 5, "feedback", {}),
  (GRAPH, 3, "feedback", {}),
  (GRAPH, 5, "answer", {}),
  (DIGITS, 5, "hint_digits", {"k": 3}),
  (DIGITS, 4, "none", {}),
]


@pytest.mark.parametrize("env,level,name,kwargs", CASES)
def test_contexts_fit_their_declared_length_and_characters(env, level, name, kwargs):
  rng = _rng()
  limit = env.max_prompt_chars(level) + contexts.max_context_chars(env, level, name, **kwargs)
  junk = list(envs.CHARSET) + ["x", "é"]
  for p in env.sample(jax.random.key(4), 200, level=level):
    attempts = [
      p.answer,
      env.corrupt(p, rng) if hasattr(env, "corrupt") else p.answer,
      "".join(rng.choice(junk, int(rng.integers(0, 12)))),
    ]
    for attempt in attempts:
      text = contexts.teacher_prompt(env, p, attempt, rng, name, **kwargs)
      assert len(text) <= limit, (text, limit)
      assert set(text) <= set(env.chars) | set(contexts.CHARS), text


def test_max_context_chars():
  assert contexts.max_context_chars(ARITH, 3, "none") == 0
  assert contexts.max_context_chars(ARITH, 3, "answer") == 5  # "0579|"
  assert contexts.max_context_chars(ARITH, 3, "hint_digits", k=1) == 5  # "-5--|"
  assert contexts.max_context_chars(ARITH, 3, "feedback") == 11  # "10350!1035|"
  assert contexts.max_context_chars(GRAPH, 3, "feedback") == 6  # "ab!ac|"


@pytest.mark.parametrize(
  "env,name,kwargs",
  [
    (ARITH, "hint_digits", {"k": 2}),
    (ARITH, "feedback", {}),
    (GRAPH, "feedback", {}),
    (DIGITS, "answer", {}),
  ],
)
def test_context_corpus(env, name, kwargs):
  key, n, level = jax.random.key(5), 200, 3
  plain = env.corpus(key, n, level=level, noise=0.3)
  rows = contexts.context_corpus(
    env, key, n, level=level, noise=0.3, name=name, fraction=0.25, **kwargs
  )
  assert rows == contexts.context_corpus(
    env, key, n, level=level, noise=0.3, name=name, fraction=0.25, **kwargs
  )
  assert rows != contexts.context_corpus(
    env, jax.random.key(6), n, level=level, noise=0.3, name=name, fraction=0.25, **kwargs
  )
  with_context = [i for i, (prompt, _) in enumerate(rows) if "|" in prompt]
  assert len(with_context) == 50
  problems = env.sample(key, n, level=level)
  for i, (prompt, completion) in enumerate(rows):
    if i in with_context:  # the context, then the student's prompt; answered correctly
      assert prompt.endswith("|" + problems[i].prompt) and completion == problems[i].answer
    else:
      assert (prompt, completion) == plain[i]
  if name == "feedback":  # about wrong attempts mostly, correct ones (OK) a quarter of the time
    notes = [rows[i][0].split("|")[0] for i in with_context]
    assert 0.1 < np.mean([t == "OK" for t in notes]) < 0.45
  assert (
    contexts.context_corpus(env, key, n, level=level, noise=0.3, name=name, fraction=0.0, **kwargs)
    == plain
  )


def test_context_corpus_refuses_what_it_cannot_build():
  with pytest.raises(ConfigError, match="lies in"):
    contexts.context_corpus(
      ARITH, jax.random.key(0), 4, level=2, noise=0.0, name="answer", fraction=1.5
    )
  with pytest.raises(ConfigError, match="corrupt"):
    contexts.context_corpus(
      envs.ENVS["countdown"],
      jax.random.key(0),
      4,
      level=3,
      noise=0.0,
      name="feedback",
      fraction=0.5,
    )


def test_charsets_of_existing_runs_do_not_change():
  core = " ()*+-/0123456789:=>"
  assert envs.CORE_CHARSET == core
  assert envs.CHARSET == " !%&()*+-/0123456789:=>BCDEGHKLMNOPQRSUVXYZabcdefgh|"
  for name in ("arithmetic", "countdown", "digit_sum"):
    assert envs.tokenizer_charset(name) == core
  assert envs.tokenizer_charset("graph_path") == envs.CHARSET
  # A task registered later with new characters widens only its own runs' tokenizers.
  assert envs.tokenizer_charset("grammar") == "".join(
    sorted(set(envs.CHARSET) | set(envs.ENVS["grammar"].chars))
  )
  # A run with a context widens its tokenizer by contexts.CHARS: all already in CHARSET, so
  # train.context.run_charset(config, extra_chars=contexts.CHARS) gives CHARSET.
  assert contexts.CHARS == "!-KO|" and set(contexts.CHARS) <= set(envs.CHARSET)
  assert not set(contexts.CHARS) <= set(core)


def test_hint_digits_with_k_minus_one_reveals_a_random_number_of_digits():
  """k = -1: every informativeness 0..n appears, about equally often, and the revealed digits
  are the answer's."""
  env = envs.get_env("arithmetic")
  problem = env.make(123, 456, 3)  # answer 579, padded to 0579
  rng = np.random.default_rng(0)
  hints = [contexts.hint_digits(env, problem, None, rng, k=-1) for _ in range(2000)]
  counts = np.bincount([4 - h.count(contexts.HIDDEN) for h in hints], minlength=5)
  assert counts.min() > 300 and counts.sum() == 2000
  assert all(c in (contexts.HIDDEN, t) for h in hints for c, t in zip(h, "0579"))
