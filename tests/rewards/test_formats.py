"""rewards/formats.py: the strict R1 layout, the tag count, the answer blocks, and the format
hacks they refuse (several think blocks, empty answers, tags out of order)."""

import pytest

from posttrain_jax.rewards import REWARDS, formats

GOOD = "<think>\n3 + 4 = 7\n</think>\n<answer>\n7\n</answer>"


@pytest.mark.parametrize(
  "completion, fmt, tags",
  [
    (GOOD, 1.0, 1.0),
    ("<think>x</think><answer>7</answer>", 1.0, 1.0),
    ("  <think></think> <answer>7</answer>\n", 1.0, 1.0),  # an empty think block is a format
    ("<think>a</think><think>b</think><answer>7</answer>", 0.0, 0.5),  # several think blocks
    ("<think>a</think><answer>7</answer><think>b</think>", 0.0, 0.5),
    ("<think>a</think><answer></answer>", 0.0, 1.0),  # empty answer
    ("<think>a</think><answer>  \n </answer>", 0.0, 1.0),
    ("<answer>7</answer><think>a</think>", 0.0, 1.0),  # out of order: counted only
    ("</think>a<think><answer>7</answer>", 0.0, 1.0),
    ("<think>a</think><answer>7</answer> and more", 0.0, 1.0),  # text after the answer
    ("preamble <think>a</think><answer>7</answer>", 0.0, 1.0),
    ("<think>a</think>7", 0.0, 0.5),
    ("<think>a</think><answer>7", 0.0, 0.75),
    ("<answer>7</answer>", 0.0, 0.5),
    ("<answer>7</answer><answer>8</answer>", 0.0, 0.0),
    ("7", 0.0, 0.0),
    ("", 0.0, 0.0),
  ],
)
def test_format_and_tag_count(completion, fmt, tags):
  assert formats.format_reward(None, completion) == fmt
  assert formats.tag_count_reward(None, completion) == tags
  assert REWARDS["format"](None, completion) == fmt
  assert REWARDS["tag_count"](None, completion) == tags


def test_think_prefilled_by_the_chat_template():
  completion = "3 + 4 = 7</think><answer>7</answer>"
  assert formats.format_reward(None, completion) == 0.0
  assert formats.format_reward(None, completion, think_prefilled=True) == 1.0
  assert formats.tag_count_reward(None, completion) == 0.75
  assert formats.tag_count_reward(None, completion, think_prefilled=True) == 1.0
  assert formats.format_reward(None, GOOD, think_prefilled=True) == 0.0  # two <think> now


def test_non_strings_score_zero():
  for fn in (formats.format_reward, formats.tag_count_reward):
    assert fn(None, None) == 0.0 and fn(None, ["<think>"]) == 0.0


@pytest.mark.parametrize(
  "completion, blocks",
  [
    (GOOD, ["7"]),
    ("<answer></answer>", [""]),
    ("<answer>1</answer> x <answer>\n2 </answer>", ["1", "2"]),
    ("<answer>7", None),
    ("no tags", None),
    (None, None),
  ],
)
def test_answer_blocks(completion, blocks):
  assert formats.answer_blocks(completion) == blocks
