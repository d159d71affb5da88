"""long_mult, the tool-use task: its verifier on hand cases, the reference transcript, corpus
transcripts replayed through ToolEnv, and the model/env segments for loss masks."""

import jax
import numpy as np
import pytest

from posttrain_jax import envs
from posttrain_jax.envs import agent, tool_calls, tools

ENV = envs.ENVS["long_mult"]
P = ENV.make(48213, 9071, 5)
REFERENCE = "<tool>calculator(48213*9071)</tool><obs>437340123</obs>437340123"


def test_problem_and_reference_transcript():
  assert (P.prompt, P.answer, P.uid, P.data) == (
    "48213*9071=",
    "437340123",
    "48213*9071=",
    (48213, 9071),
  )
  assert ENV.reference(P) == REFERENCE
  small = ENV.make(12, 3, 2)
  assert ENV.reference(small) == "<tool>calculator(12*3)</tool><obs>36</obs>36"
  assert ENV.rebuild(envs.Problem("48213*9071=", "1", "long_mult", 5, "u")) == P


@pytest.mark.parametrize(
  "text,score",
  [
    ("437340123", 1.0),
    (" 437340123\n", 1.0),
    (REFERENCE, 1.0),
    ("<tool>calculator(48213*9071)</tool><obs>437340123</obs>", 0.0),  # did not copy it
    ("<obs>1</obs>437340123", 1.0),
    ("<obs>437340123</obs>1", 0.0),
    ("437340124", 0.0),
    ("0437340123", 0.0),
    ("437340123 437340123", 0.0),
    ("", 0.0),
    (None, 0.0),
    (437340123, 0.0),
  ],
)
def test_verify_hand_cases(text, score):
  assert ENV.verify(P, text) == score


def test_make_checks_the_operands_fit_the_level():
  with pytest.raises(ValueError, match="level 5 needs a 5-digit first operand"):
    ENV.make(4821, 9071, 5)
  with pytest.raises(ValueError, match="level 5 needs"):
    ENV.make(48213, 907, 5)
  with pytest.raises(ValueError, match=r"level must be in 2\.\.6, got 7"):
    ENV.sample(jax.random.key(0), 1, level=7)


def test_levels_draw_the_right_digit_counts():
  for level in ENV.levels:
    for p in ENV.sample(jax.random.key(level), 50, level=level):
      a, b = p.data
      assert len(str(a)) == level and len(str(b)) in (level - 1, level), p
      assert p.answer == str(a * b) and len(p.prompt) <= ENV.max_prompt_chars(level)


def _replay(problem, transcript, env):
  """Feeds the model's segments of ``transcript`` to ``env`` as turns, checking each returned
  observation against the transcript's; the last step's result."""
  segments = ENV.transcript_segments(problem, transcript)
  assert env.reset(problem) == problem.prompt
  for i, (text, is_model) in enumerate(segments):
    if not is_model:
      continue
    result = env.step(text)
    following = segments[i + 1][0] if i + 1 < len(segments) else ""
    assert result.observation == following
    if result.done:
      assert i == len(segments) - 1
      return result
  raise AssertionError(f"the episode did not end: {transcript!r}")


def test_clean_corpus_replays_to_reward_one():
  env = agent.ToolEnv(ENV, list(ENV.tools), max_turns=3)
  pairs = ENV.corpus(jax.random.key(0), 40, level=5, noise=0.0)
  problems = ENV.sample(jax.random.key(0), 40, level=5, split="train")
  assert [p.prompt for p in problems] == [prompt for prompt, _ in pairs]
  for p, (prompt, transcript) in zip(problems, pairs):
    assert transcript == ENV.reference(p)
    assert tool_calls.parse(transcript, ENV.tools) == tool_calls.Call(
      "calculator", prompt.removesuffix("=")
    )
    result = _replay(p, transcript, env)
    assert (result.reward, result.info["status"], result.info["tool_calls"]) == (1.0, "ok", 1)


def test_noisy_corpus_answers_without_the_tool():
  env = agent.ToolEnv(ENV, list(ENV.tools))
  pairs = ENV.corpus(jax.random.key(1), 60, level=2, noise=1.0)
  problems = ENV.sample(jax.random.key(1), 60, level=2, split="train")
  rewards = []
  for p, (_, transcript) in zip(problems, pairs):
    assert tool_calls.parse(transcript) is None and transcript.isdigit()
    assert transcript[: len(p.answer) // 2] == p.answer[: len(p.answer) // 2]
    result = _replay(p, transcript, env)
    assert result.reward == float(transcript == p.answer) and result.info["tool_calls"] == 0
    rewards.append(result.reward)
  assert sum(rewards) < 10  # right only by chance
  assert _replay(P, P.answer, env).reward == 1.0  # a guess that happens to be right scores
  mixed = ENV.corpus(jax.random.key(2), 200, level=4, noise=0.25)
  noisy = sum(tool_calls.TOOL_OPEN not in t for _, t in mixed)
  assert 20 <= noisy <= 80
  with pytest.raises(ValueError, match="noise"):
    ENV.corpus(jax.random.key(0), 4, level=3, noise=-0.1)


def test_segments_mark_exactly_the_observations():
  assert ENV.transcript_segments(P, REFERENCE) == [
    ("<tool>calculator(48213*9071)</tool>", True),
    ("<obs>437340123</obs>", False),
    ("437340123", True),
  ]
  two = (
    "<tool>calculator(48213*9071)</tool><obs>437340123</obs><tool>calculator(1+1)</tool>"
    "<obs>2</obs>437340123"
  )
  segments = ENV.transcript_segments(P, two)
  assert "".join(t for t, _ in segments) == two
  assert [t for t, m in segments if not m] == ["<obs>437340123</obs>", "<obs>2</obs>"]
  model_chars = np.concatenate([np.full(len(t), m) for t, m in segments])
  obs_start = two.index("<obs>2")
  assert not model_chars[obs_start : obs_start + len("<obs>2</obs>")].any()
  assert model_chars.sum() == len(two) - len("<obs>437340123</obs>") - len("<obs>2</obs>")
  with pytest.raises(ValueError, match="needs a long_mult problem"):
    ENV.transcript_segments(envs.ENVS["arithmetic"].make(1, 2, 1), REFERENCE)


def test_its_tokenizer_holds_transcripts_and_error_observations():
  charset = set(envs.tokenizer_charset("long_mult"))
  for prompt, transcript in ENV.corpus(jax.random.key(3), 50, level=6, noise=0.5):
    assert set(prompt + transcript) <= charset
  calc = tools.make_tool("calculator")
  errors = [calc(a).text for a in ("x", "1/0", "1+", "2**3", "1.5", "(1).y", "f(1)", "")]
  errors += [
    tool_calls.parse(t, ENV.tools).reason
    for t in (
      "<tool>abacus(1)</tool>",
      "<tool>calculator(1",
      "1</tool>",
      "<tool>calculator((1)</tool>",
      "<tool>calculator 1</tool>",
    )
  ]
  env = agent.ToolEnv(ENV, list(ENV.tools), max_obs_chars=8)
  env.reset(P)
  errors.append(env.step("<tool>calculator(x)</tool>").observation)
  assert set("".join(errors)) <= set(ENV.chars) <= charset
