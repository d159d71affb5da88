"""Named pieces: the config and training errors, the registry lookup and the inputs a piece
declares.

The one leaf module every layer may import (it imports nothing of the package). A registry is a
plain dict from name to function (DESIGN.md section 4); a config names a piece by string,
:func:`lookup` finds it or raises a :class:`ConfigError` that lists the valid names.

A piece states the batch fields it reads with :func:`reads`; the RL step computes exactly the
fields its selected pieces read (``train/inputs.py``: one producer per field)::

    @registry.reads("teacher_logprobs")
    def my_advantage(inputs, *, num_groups): ...
"""

from typing import Callable, Iterable


class ConfigError(ValueError):
  """The experiment config is invalid; the message names the key and how to fix it."""


class TrainingError(RuntimeError):
  """Training cannot go on (e.g. the loss stayed non-finite, or too many reward calls failed);
  the message names the cause and the config key to change."""


class StagePaused(Exception):
  """A stage stopped on purpose before its last step (``config.rl.pause_after``), with a
  checkpoint at ``step``: a later run of the same workdir with a larger pause (or 0) continues
  it bit for bit. Not an error: ``main`` reports it and exits 0 (multi-fidelity HPO promotes a
  trial from one step budget to the next this way, sweeps/hpo.py)."""

  def __init__(self, stage: str, step: int):
    super().__init__(f"[{stage}] paused after step {step}")
    self.stage, self.step = stage, step


def lookup(registry: dict, name: str, kind: str):
  """``registry[name]``, or a ConfigError naming ``kind`` and listing the valid names."""
  if name not in registry:
    valid = ", ".join(sorted(registry))
    raise ConfigError(f"unknown {kind} {name!r}; valid {kind} names: {valid}")
  return registry[name]


def reads(*fields: str) -> Callable:
  """Decorator: ``fn.reads`` = the batch fields ``fn`` needs beyond its kind's fixed inputs
  (e.g. ``"ref_logprobs"``, ``"teacher_logprobs"``, ``"values"``, ``"baseline_rewards"``,
  ``"group"``). Returns ``fn`` itself, so a registry stays a dict of plain functions."""

  def tag(fn):
    fn.reads = frozenset(fields)
    return fn

  return tag


def adapts(fn: Callable, *, fills: Iterable[str] = ()) -> Callable:
  """Decorator of a registry adapter that calls the pure function ``fn``: records it
  (``adapter.adapts``) and the keywords the adapter sets itself (``adapter.fills``), so that a
  test can check the adapter passes on every other keyword ``fn`` accepts (a config's
  ``*_kwargs`` reach the function). Returns the adapter itself."""

  def tag(adapter):
    adapter.adapts = fn
    adapter.fills = frozenset(fills)
    return adapter

  return tag


def choices(**options: Iterable[str]) -> Callable:
  """Decorator: ``fn.choices`` = keyword -> the values it accepts (e.g.
  ``whitening=("population", "unbiased")``), so a config's bad value is refused when it is
  validated, with the valid ones listed, not when the step first runs. Returns ``fn`` itself."""

  def tag(fn):
    fn.choices = {k: tuple(v) for k, v in options.items()}
    return fn

  return tag


def reads_of(fns: Iterable) -> frozenset:
  """The union of the fields the pieces ``fns`` read (a piece without a tag reads none)."""
  out = frozenset()
  for fn in fns:
    out |= getattr(fn, "reads", frozenset())
  return out
