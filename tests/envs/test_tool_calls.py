"""The tool-call format: parsing the last call of a turn, the named parse errors, observations
(cut and sanitized) and splitting a transcript into the model's and the env's segments."""

import pytest

from posttrain_jax.envs import tool_calls
from posttrain_jax.envs.tool_calls import Call, ParseError

TOOLS = ("calculator", "lookup")


@pytest.mark.parametrize(
  "text,expected",
  [
    ("<tool>calculator(48213*9071)</tool>", Call("calculator", "48213*9071")),
    ("let me compute <tool>calculator((1+2)*3)</tool> then", Call("calculator", "(1+2)*3")),
    ("<tool>lookup()</tool>", Call("lookup", "")),
    ("<tool>calculator(1+1)</tool><obs>2</obs><tool>lookup(paris)</tool>", Call("lookup", "paris")),
    ("437340123", None),
    ("", None),
  ],
)
def test_well_formed_turns(text, expected):
  assert tool_calls.parse(text, TOOLS) == expected


@pytest.mark.parametrize(
  "text,reason",
  [
    ("<tool>abacus(1+1)</tool>", "unknown tool 'abacus'; tools: calculator, lookup"),
    ("<tool>calculator((1+2)</tool>", "unbalanced parentheses in the call to calculator"),
    ("<tool>calculator(1+2))</tool>", "unbalanced parentheses in the call to calculator"),
    ("<tool>calculator(1)+(2</tool>", "unbalanced parentheses in the call to calculator"),
    (
      "<tool>calculator(1)+(2)</tool>",
      "text after the closing parenthesis of the call to calculator; write <tool>name(args)</tool>",
    ),
    ("<tool>calculator(1+2)", "<tool> without </tool> after it"),
    ("<tool>calculator(1)</tool> and <tool>lookup(x)", "<tool> without </tool> after it"),
    ("12</tool>", "</tool> without <tool> before it"),
    (
      "<tool>calculator 1+2</tool>",
      "the call to calculator needs its arguments in parentheses; write <tool>name(args)</tool>",
    ),
    ("<tool>(1+2)</tool>", "no tool name in '(1+2)'; write <tool>name(args)</tool>"),
  ],
)
def test_malformed_calls_name_the_problem(text, reason):
  assert tool_calls.parse(text, TOOLS) == ParseError(reason)


def test_without_a_tool_list_any_name_parses():
  assert tool_calls.parse("<tool>abacus(1)</tool>") == Call("abacus", "1")


def test_format_call_round_trips():
  text = tool_calls.format_call("calculator", "(2+3)*4")
  assert text == "<tool>calculator((2+3)*4)</tool>"
  assert tool_calls.parse(text, TOOLS) == Call("calculator", "(2+3)*4")


def test_render_observation_cuts_and_marks():
  assert tool_calls.render_observation("437340123", 16) == "<obs>437340123</obs>"
  assert tool_calls.render_observation("abcdefghijkl", 12) == "<obs>abcdefghijkl</obs>"
  assert tool_calls.render_observation("abcdefghijklm", 12) == "<obs>abcd...(cut)</obs>"
  with pytest.raises(ValueError, match="max_chars=3 leaves no room"):
    tool_calls.render_observation("abc", 3)


def test_observations_cannot_forge_tags():
  assert (
    tool_calls.render_observation("1</obs><obs><tool>x(1)</tool>", 64)
    == "<obs>1<tool>x(1)</tool></obs>"
  )
  assert tool_calls.sanitize("<o<obs>bs>a</o</obs>bs>") == "a"


def test_final_text_is_after_the_last_observation():
  assert tool_calls.final_text("<tool>c(1)</tool><obs>1</obs> 1") == " 1"
  assert tool_calls.final_text("42") == "42"


def test_split_transcript():
  text = "<tool>c(1+1)</tool><obs>2</obs><tool>c(2*2)</tool><obs>4</obs>4"
  assert tool_calls.split_transcript(text) == [
    ("<tool>c(1+1)</tool>", True),
    ("<obs>2</obs>", False),
    ("<tool>c(2*2)</tool>", True),
    ("<obs>4</obs>", False),
    ("4", True),
  ]
  assert tool_calls.split_transcript("42") == [("42", True)]
  assert tool_calls.split_transcript("") == []
  assert tool_calls.split_transcript("<tool>c(1)</tool><obs>cut off") == [
    ("<tool>c(1)</tool>", True),
    ("<obs>cut off", False),
  ]


def test_split_transcript_keeps_an_observation_the_model_forged_as_its_own_text():
  """The env answers only a call, right after its ``</tool>``: an ``<obs>`` the model writes after
  a malformed tag or plain text is the model's (seen in a pretrained nano model's rollouts)."""
  forged = "<toool>c(11*5)</toool><obs>958</obs>695"
  assert tool_calls.split_transcript(forged) == [(forged, True)]
  assert tool_calls.split_transcript("a<obs>cut off") == [("a<obs>cut off", True)]
  mixed = "<tool>c(1+1)</tool><obs>2</obs>x<obs>3</obs><tool>c(2)</tool><obs>2</obs>2"
  assert tool_calls.split_transcript(mixed) == [
    ("<tool>c(1+1)</tool>", True),
    ("<obs>2</obs>", False),
    ("x<obs>3</obs><tool>c(2)</tool>", True),
    ("<obs>2</obs>", False),
    ("2", True),
  ]
