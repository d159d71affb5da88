"""One loop for every trained stage (pretraining, a teacher, a reward model, RL): step, stop on
repeated non-finite updates, evaluate on a cadence, write the metrics, checkpoint on a cadence.

What differs between stages is passed in: the step, the evaluation, what a checkpoint holds,
and for RL a stop rule (the rollout budget) and how many skipped updates make a skipped step.
A killed stage resumes from its last checkpoint with ``start`` and ``skipped`` read from it, so
the loop writes the same records as an uninterrupted run.
"""

import time
from typing import Callable

from posttrain_jax.train import context as context_lib


def state_checkpoint(ckpt) -> Callable:
  """The ``checkpoint`` of a stage whose carry is one train state (pretraining, a teacher, a
  reward model): the state, with the step, elapsed time and consecutive skipped steps."""

  def save(done, state, record, skipped):
    ckpt.save(done, state, {"step": done, "elapsed": record["time/elapsed"], "skipped": skipped})

  return save


def train_loop(
  carry,
  *,
  label: str,
  cfg,
  start: int,
  step: Callable,
  evaluate: Callable,
  checkpoint: Callable,
  writer,
  bar,
  t0: float,
  skipped: int = 0,
  skip_threshold: int = 1,
  stop: Callable | None = None,
):
  """Runs steps ``start .. cfg.steps - 1`` and returns the final ``carry``.

  Args:
    carry: what the steps update (a train state, the RL run state).
    label: the config section named in a non-finite stop's message (``pretrain``, ``rl`` ...).
    cfg: that section: ``steps``, ``eval_every`` (0: never), ``checkpoint_every``,
      ``max_nonfinite_steps``.
    step: ``(carry, s) -> (carry, record)``, ``record`` a dict of host floats with
      ``train/skipped`` (updates skipped this step) and ``train/nonfinite``.
    evaluate: ``carry -> metrics``, merged into the record every ``eval_every`` steps and at
      the last step.
    checkpoint: ``(done, carry, record, skipped) -> None``, every ``checkpoint_every`` steps
      and at the last step.
    writer, bar: the metric writer and the progress bar.
    t0: the stage's start time (``time.time()`` less the time before a resume).
    skipped: consecutive skipped steps before ``start`` (from the checkpoint).
    skip_threshold: updates skipped in one step that make it a skipped step.
    stop: ``() -> bool``: checked before each step; a step after which it holds is the last.
  """
  for s in range(start, cfg.steps):
    if stop is not None and stop():
      break
    carry, record = step(carry, s)
    done = s + 1
    last = done == cfg.steps or bool(stop is not None and stop())
    skipped = skipped + 1 if record["train/skipped"] >= skip_threshold else 0
    if skipped >= cfg.max_nonfinite_steps:
      raise context_lib.TrainingError(
        context_lib.skipped_message(label, cfg, skipped, done, record["train/nonfinite"])
      )
    if cfg.eval_every and (done % cfg.eval_every == 0 or last):
      record.update(evaluate(carry))
    record["time/elapsed"] = time.time() - t0
    writer.write(done, record)
    bar.update(record)
    if done % cfg.checkpoint_every == 0 or last:
      checkpoint(done, carry, record, skipped)
  return carry


def supervised(ctx, stage: str, cfg, resumed, step: Callable, evaluator, *, keys=()) -> tuple:
  """The loop of a supervised stage whose carry is one train state (sft, preference): a
  progress bar, :func:`train_loop` from ``resumed`` (``context.resume_stage``), the state
  checkpointed on ``cfg``'s cadence, everything closed after; returns ``(state, last record)``
  (the last record is ``{}`` on other processes and for a stage of 0 steps)."""
  from posttrain_jax import io as ptio  # pylint: disable=import-outside-toplevel

  r = resumed
  bar = ptio.Progress(
    cfg.steps, initial=r.start, desc=stage, enabled=ctx.show_progress, keys=tuple(keys)
  )
  try:
    state = train_loop(
      r.state,
      label=stage,
      cfg=cfg,
      start=r.start,
      step=step,
      evaluate=lambda state: evaluator(state.params, ctx.eval_key),
      checkpoint=state_checkpoint(r.ckpt),
      writer=r.writer,
      bar=bar,
      t0=time.time() - r.elapsed,
      skipped=r.skipped,
    )
  finally:
    r.ckpt.close()  # a save in flight completes, also when the run stops
  bar.close()
  r.writer.close()
  last = ptio.read_jsonl(r.writer.path)[-1] if cfg.steps and ctx.is_primary else {}
  return state, last
