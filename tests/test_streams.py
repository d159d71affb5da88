"""The table of random streams (posttrain_jax/streams.py): no two streams of one parent share a
tag, and the check finds a collision such as the one GKD and DenoiseRL once had (both 11)."""

import pytest

from posttrain_jax import streams


def test_no_two_streams_of_one_parent_share_a_tag():
  streams.check()


def test_the_check_refuses_a_collision_and_an_overlapping_range():
  table = dict(streams.STREAMS)
  table["gkd_coin"] = streams.Stream("step", 11)
  table["denoise_weak"] = streams.Stream("step", 11)
  with pytest.raises(ValueError, match="'denoise_weak' and 'gkd_coin'|'gkd_coin' and 'denoise"):
    streams.check(table)
  ranged = dict(streams.STREAMS, late=streams.Stream("step", 1000))  # inside 'rounds' 100..1123
  with pytest.raises(ValueError, match="rounds"):
    streams.check(ranged)
  other_parent = dict(streams.STREAMS, late=streams.Stream("run", 1000))
  streams.check(other_parent)


def test_a_range_stream_keeps_its_offsets_inside_its_span():
  assert streams.tag("rounds", 3) == streams.STREAMS["rounds"].tag + 3
  with pytest.raises(ValueError, match="outside"):
    streams.tag("rounds", streams.STREAMS["rounds"].span)
  with pytest.raises(ValueError, match="outside"):
    streams.tag("update", 1)
