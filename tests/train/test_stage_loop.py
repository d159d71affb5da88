"""train/stage_loop.py: the one loop of every trained stage, on a counter: evaluation and
checkpoint cadence (and always at the last step), the stop rule making its step the last, the
non-finite stop after max_nonfinite_steps consecutive skipped steps, and resuming."""

import types

import pytest

from posttrain_jax.train import context as context_lib
from posttrain_jax.train import stage_loop


class Log:
  def __init__(self):
    self.records = []

  def write(self, step, record):
    self.records.append((step, dict(record)))

  def update(self, record):
    pass


def _cfg(**kw):
  base = dict(
    steps=7, eval_every=3, checkpoint_every=2, max_nonfinite_steps=2, lr=1e-3, grad_clip=1.0
  )
  return types.SimpleNamespace(**{**base, **kw})


def _run(cfg, *, start=0, skipped_at=(), stop=None, skip_threshold=1, skipped=0, per_step=1):
  log, saved = Log(), []

  def step(carry, s):
    return carry + 1, {
      "train/skipped": float(per_step if s in skipped_at else 0),
      "train/nonfinite": 1.0,
    }

  out = stage_loop.train_loop(
    start,
    label="pretrain",
    cfg=cfg,
    start=start,
    step=step,
    evaluate=lambda carry: {"eval/carry": float(carry)},
    checkpoint=lambda done, carry, record, skipped: saved.append((done, carry, skipped)),
    writer=log,
    bar=log,
    t0=0.0,
    skipped=skipped,
    skip_threshold=skip_threshold,
    stop=stop,
  )
  return out, log.records, saved


def test_cadences_and_the_last_step():
  out, records, saved = _run(_cfg())
  assert out == 7 and [s for s, _ in records] == [1, 2, 3, 4, 5, 6, 7]
  assert [s for s, r in records if "eval/carry" in r] == [3, 6, 7]
  assert [d for d, _, _ in saved] == [2, 4, 6, 7]
  _, records, _ = _run(_cfg(eval_every=0))
  assert not any("eval/carry" in r for _, r in records)


def test_a_resumed_loop_writes_the_same_records_from_its_start():
  _, full, full_saved = _run(_cfg())
  _, tail, tail_saved = _run(_cfg(), start=4)
  assert [s for s, _ in tail] == [5, 6, 7]
  assert [(s, r["eval/carry"] if "eval/carry" in r else None) for s, r in tail] == [
    (s, r.get("eval/carry")) for s, r in full[4:]
  ]
  assert tail_saved == full_saved[2:]


def test_the_stop_rule_makes_its_step_the_last():
  seen, log, saved = [], Log(), []
  stage_loop.train_loop(
    0,
    label="rl",
    cfg=_cfg(eval_every=5, checkpoint_every=10),
    start=0,
    step=lambda c, s: (seen.append(s) or c + 1, {"train/skipped": 0.0, "train/nonfinite": 0.0}),
    evaluate=lambda c: {"eval/carry": float(c)},
    checkpoint=lambda done, carry, record, skipped: saved.append(done),
    writer=log,
    bar=log,
    t0=0.0,
    stop=lambda: len(seen) >= 4,
  )
  assert seen == [0, 1, 2, 3]  # stopped before step 4
  assert saved == [4] and "eval/carry" in log.records[-1][1]  # the stopping step is the last


def test_repeated_skipped_steps_stop_with_the_stage_message():
  with pytest.raises(context_lib.TrainingError, match="pretrain"):
    _run(_cfg(), skipped_at=(2, 3))
  _, records, _ = _run(_cfg(), skipped_at=(1, 3, 5))  # never two in a row
  assert len(records) == 7
  with pytest.raises(context_lib.TrainingError):  # one more after a resume at 1 skipped
    _run(_cfg(), start=3, skipped_at=(3,), skipped=1)
  # RL: a step is skipped when all its epochs x minibatches updates were
  _, records, _ = _run(_cfg(), skipped_at=(2, 3), skip_threshold=4, per_step=3)
  assert len(records) == 7
  with pytest.raises(context_lib.TrainingError, match="rl|pretrain"):
    _run(_cfg(), skipped_at=(2, 3), skip_threshold=4, per_step=4)
