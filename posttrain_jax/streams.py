"""Every random stream of a run, named in one table (DESIGN.md section 5: per-step keys by
``fold_in``, never a key a function makes itself).

A stream is a tag folded into a parent key: ``jax.random.fold_in(parent, tag(name))``. Streams
of the same parent must differ, or two draws that should be independent are the same draw;
:func:`check` (run by the tests) refuses two streams of one parent whose tags overlap. Some
streams are ranges (a tag plus an offset: dynamic sampling's round ``r``, an asynchronous
producer's batch ``n``); their ``span`` is the number of tags they may use.

Parents:
  ``run``: the run's key (``ctx.key``, from ``config.seed``).
  ``rl``: the RL stage's key (``fold_in(ctx.key, tag('rl'))``), folded with the step index for
    each step's key; its other streams lie above any step index.
  ``step``: one RL step's key (``fold_in(rl_key, step)``), which is also its first draw
    round's key; a later round ``r`` draws from ``fold_in(step_key, tag('rounds', r))`` with the
    same tags.
"""

from typing import NamedTuple


class Stream(NamedTuple):
  parent: str
  tag: int
  span: int = 1  # how many consecutive tags the stream may use (tag + offset, offset < span)
  doc: str = ""


STREAMS: dict[str, Stream] = {
  # --- folded into the run's key (ctx.key) ----------------------------------------------------
  "pretrain": Stream("run", 1, doc="the pretraining (and SFT) stage's batches"),
  "rl": Stream("run", 2, doc="the RL stage's key; each step folds in its index"),
  "init": Stream("run", 3, doc="the model's initialisation seed"),
  "lora": Stream("run", 4, doc="LoRA adapters' initialisation"),
  "reward_model": Stream("run", 5, doc="the reward_model stage's pairs and head"),
  "sft": Stream(
    "run", 6, doc="the sft stage's gold transcripts (tag) and pass orders (tag + 1 + pass)"
  ),
  "preference": Stream(
    "run", 7, doc="the preference stage's env pairs (tag) and pass orders (tag + 1 + pass)"
  ),
  "search": Stream(
    "run", 8, doc="the search stage's populations, problems and validation set (per round)"
  ),
  "pass_band": Stream("run", 9, doc="the pass-rate band's pool of prompts and their samples"),
  "save_offline": Stream("run", 1 << 22, span=1 << 20, doc="SAVE's offline pairs, per RM step"),
  # --- folded into the RL stage's key, above every step index ---------------------------------
  "async": Stream("rl", 1 << 20, span=1 << 20, doc="the asynchronous producer's batch n"),
  # --- folded into one RL step's key ------------------------------------------------------------
  "candidates": Stream("step", 0, doc="the prompt source's candidates"),
  "sample": Stream("step", 1, doc="the sampler's tokens"),
  "update": Stream("step", 2, doc="the update's minibatch permutations"),
  "greedy_baseline": Stream("step", 3, doc="ReMax's greedy baseline rollouts"),
  "select": Stream("step", 5, doc="the prompt scheduler's selection"),
  "compose": Stream("step", 6, doc="the replay scheduler's choice of stored rows"),
  "teacher_context": Stream("step", 7, doc="the teacher's privileged contexts"),
  "gkd_coin": Stream("step", 11, doc="GKD's on- or off-policy coin"),
  "denoise_weak": Stream("step", 12, doc="DenoiseRL's weak-model answers"),
  "sft_mix": Stream("step", 13, doc="RL+SFT averaging's supervised rows"),
  "rounds": Stream("step", 100, span=1 << 10, doc="dynamic sampling's round r >= 1 (tag 100 + r)"),
}


def tag(name: str, offset: int = 0) -> int:
  """The tag of stream ``name`` (plus ``offset`` for a range stream, ``0 <= offset < span``)."""
  stream = STREAMS[name]
  if not 0 <= offset < stream.span:
    raise ValueError(f"stream {name!r} has {stream.span} tags; offset {offset} is outside them")
  return stream.tag + offset


def check(streams: dict[str, Stream] = STREAMS) -> None:
  """Raises ValueError naming two streams of one parent whose tags overlap."""
  by_parent: dict[str, list] = {}
  for name, s in streams.items():
    by_parent.setdefault(s.parent, []).append((s.tag, s.tag + s.span, name))
  for parent, ranges in by_parent.items():
    ranges.sort()
    for (_, hi, a), (lo, _, b) in zip(ranges, ranges[1:]):
      if lo < hi:
        raise ValueError(
          f"streams {a!r} and {b!r} of parent {parent!r} share tags; give one of them a free "
          "tag in posttrain_jax/streams.py"
        )
