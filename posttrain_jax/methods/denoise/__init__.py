"""DenoiseRL (methods_B.md section 15; docs/denoise.md): some rows of each group continue from a
weak model's wrong partial answer. The math and host logic are in :mod:`.prefixes`; this is its
``METHODS`` entry: the config check, the weak model, the ``prefix`` hook of each draw round and
the eval stage's recovery rate."""

from posttrain_jax import parallel
from posttrain_jax.methods.denoise import prefixes
from posttrain_jax.methods.denoise.fields import DENOISE
from posttrain_jax.methods.denoise.prefixes import (
  Weak,
  cut_prefix,
  loss_rollout,
  noisy_rows,
  recovery_eval,
  row_metrics,
  wrong_traces,
)
from posttrain_jax.registry import ConfigError
from posttrain_jax.train import hooks


def _require(ok: bool, message: str) -> None:
  if not ok:
    raise ConfigError(message)


def check(config) -> None:
  """DenoiseRL: its weak model is the teacher stage's, and training on the prefix needs the
  trainer's old log-probs (the sampler records none for inserted tokens)."""
  d = config.rl.denoise
  _require(
    config.rl.teacher.source == "stage" and "teacher" in tuple(config.stages),
    "config.rl.denoise reads its weak model from the teacher stage: set config.rl."
    "teacher.source='stage' (pretrain_steps: how weak; loss='') and put 'teacher' in "
    "config.stages before 'rl'",
  )
  _require(
    isinstance(d.boundary, str),
    f"config.rl.denoise.boundary must be a string (the "
    f"step delimiter; '' cuts characters), got {d.boundary!r}",
  )
  _require(
    d.mask_prefix or config.rl.old_logprobs == "recomputed",
    "config.rl.denoise.mask_prefix=False trains on the prefix tokens, whose behaviour "
    "log-probs the sampler does not record: set config.rl.old_logprobs='recomputed'",
  )
  _require(
    not config.rl.routing_replay,
    "config.rl.routing_replay records routes in the "
    "single-turn sampler only; turn it off with config.rl.denoise",
  )
  _require(
    config.distributed.num_processes <= 1 and not config.distributed.coordinator_address,
    "config.rl.denoise runs in one process (the host builds every row's prefix); drop "
    "the distributed settings",
  )
  _require(
    config.rl.scheduler.name in ("none", "uniform"),
    "config.rl.denoise lays out its noisy rows within each prompt's group: use "
    "config.rl.scheduler.name='none'",
  )


def prefix(ctx, run, weak, sel, verifier, key) -> hooks.Prefix:
  """The round's prefixes: the last ``fraction`` of each group continue from ``rho`` of a
  wrong weak trace; after scoring, the loss mask and the recovery metrics."""
  del run
  d = ctx.config.rl.denoise
  ids, lengths, metrics = prefixes.prefixes(
    ctx, weak, verifier, sel.problems, sel.group, key, rho=float(d.rho), fraction=float(d.fraction)
  )
  mask_prefix = bool(d.mask_prefix)

  def finish(ro, rewards, valid):
    out = loss_rollout(ro, lengths, mask_prefix)
    return out, row_metrics(parallel.to_host(rewards), lengths, valid)

  return hooks.Prefix(ids, lengths, metrics, finish)


def evaluate(ctx):
  """The eval stage's ``recovery`` rate (``recovery_before_rl``, ``recovery_after_rl``)."""
  recovery = prefixes.recovery_evaluator(ctx)
  return lambda params: {"recovery": recovery(params)}


METHOD = hooks.Method(
  name="denoise",
  section="rl.denoise",
  active=lambda config: bool(config.rl.denoise.enabled),
  doc="docs/denoise.md",
  check=check,
  build=lambda ctx, init_params: prefixes.build(ctx),
  stages=("teacher",),
  prefix=prefix,
  evaluate=evaluate,
  fields={"rl.denoise": DENOISE},
)

__all__ = [
  "METHOD",
  "Weak",
  "check",
  "cut_prefix",
  "loss_rollout",
  "noisy_rows",
  "prefixes",
  "recovery_eval",
  "row_metrics",
  "wrong_traces",
]
