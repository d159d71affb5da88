"""The RL stage's rollouts as reasoning-data records (``config.rl.dump_rollouts.every``;
envs/records.py): what was sampled, how it was checked and by which policy, one JSON line per
rollout in ``<workdir>/rl/rollouts.jsonl``, readable by ``envs.records.read_records``, the SFT
stage and ``envs.StaticDataset``.

Its ``METHODS`` entry: ``after_rollouts`` on every ``every``-th step writes the step's real rows
(provenance ``source='model'``, ``source_model='policy@v<weights version>'``, ``step``, and
``difficulty`` = 1 - the group's mean reward, the sampling policy's failure rate on the prompt).
A run resumed from a checkpoint first drops the records of the steps it redoes, so the file
holds each step once.
"""

import json
import os

import numpy as np

from posttrain_jax import parallel, rollout
from posttrain_jax.envs import records
from posttrain_jax.io import metrics as metrics_io
from posttrain_jax.methods.rollout_dump.fields import DUMP
from posttrain_jax.train import hooks

FILE = "rollouts.jsonl"


def active(config) -> bool:
  return bool(config.rl.dump_rollouts.every)


class Dump:
  """The file and whether this process has trimmed it to the resumed step yet."""

  def __init__(self, path: str):
    self.path, self.trimmed = path, False

  def trim(self, step: int) -> None:
    """Drops the records of steps >= ``step`` (a resumed run redoes them)."""
    if self.trimmed:
      return
    self.trimmed = True
    if not os.path.exists(self.path):
      return
    kept = [r for r in metrics_io.read_jsonl(self.path) if r["provenance"].get("step", 0) < step]
    tmp = self.path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in kept)
    os.replace(tmp, self.path)


def build(ctx, init_params) -> Dump:
  del init_params
  return Dump(os.path.join(ctx.stage_dir("rl"), FILE))


def step_records(ctx, gen, step: int) -> list:
  """The records of ``gen``'s real rows (the host's copy)."""
  sel = gen.sel
  completion, rewards = parallel.to_host((gen.ro.completion, gen.rewards))
  texts = rollout.decode_completions(ctx.tokenizer, completion)
  real = np.asarray(sel.valid) > 0
  group = np.asarray(sel.group)
  out = []
  for b in np.flatnonzero(real):
    same = real & (group == group[b])
    problem = sel.problems[group[b]]
    out.append(
      records.from_problem(
        problem,
        texts[b],
        score=float(rewards[b]),
        source="model",
        source_model=f"policy@v{gen.version}",
        delimiter=getattr(ctx.env, "step_delimiter", ";"),
        step=int(step),
        difficulty=float(1.0 - rewards[same].mean()),
      )
    )
  return out


def after_rollouts(ctx, run, dump: Dump, state, gen, key, step, scratch):
  del run, key, scratch
  dump.trim(int(step))
  if int(step) % int(ctx.config.rl.dump_rollouts.every) == 0 and ctx.is_primary:
    records.write_records(dump.path, step_records(ctx, gen, int(step)), append=True)
  return gen, state, {}


METHOD = hooks.Method(
  name="rollout_dump",
  section="rl.dump_rollouts",
  active=active,
  doc="docs/reasoning_data.md",
  build=build,
  after_rollouts=after_rollouts,
  sync_only=True,
  fields={"rl.dump_rollouts": DUMP},
)

__all__ = ["METHOD", "step_records"]
