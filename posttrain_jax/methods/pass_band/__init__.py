"""RL on a band of pass rates (``config.rl.pass_band``; the primer on post-training reasoning
data, arXiv 2606.02113, methods_A.md section 15: "difficulty relative to the model's pass
rate").

At the RL stage's setup the start policy answers each of ``pool`` training prompts (drawn from
the env in equal shares of ``levels``, the ``pass_band`` stream) ``samples`` times at the RL
temperature; a prompt's pass rate is its mean reward (the share solved, for a 0/1 verifier).
Every pool prompt is written as a reasoning-data record (envs/records.py) with that rate as
``provenance.base_pass_rate`` and the start as its source model to
``<workdir>/rl/pass_rates.jsonl``; those with ``low <= rate <= high`` also go to
``<workdir>/rl/pass_band.jsonl`` (filter ``pass_band[low,high]``), and the RL stage draws its
prompts from that file, in seeded epochs, all levels (the ``prompts`` hook). The annotation
depends on the seed and the start alone, so the arms of a sweep that share a start annotate
the same pool and differ only in the band. A band that keeps no prompt stops the run with the
pool's rates.

Metrics (every step): ``pass_band/kept`` (prompts in the band), ``pass_band/kept_rate`` (their
mean start pass rate) and ``pass_band/pool_rate`` (the pool's).
"""

import os

import jax
import numpy as np

from posttrain_jax import envs, parallel, streams
from posttrain_jax.envs import records
from posttrain_jax.methods.pass_band.fields import PASS_BAND
from posttrain_jax.registry import ConfigError
from posttrain_jax.train import hooks, samplers

RATES_FILE = "pass_rates.jsonl"
BAND_FILE = "pass_band.jsonl"


def active(config) -> bool:
  return bool(config.rl.pass_band.pool)


def check(config) -> None:
  cfg = config.rl.pass_band
  if cfg.low > cfg.high:
    raise ConfigError(
      f"config.rl.pass_band: low={cfg.low} > high={cfg.high}; the band is low <= rate <= high"
    )
  if config.env.dataset:
    raise ConfigError(
      "config.rl.pass_band draws its pool from the env; unset config.env.dataset "
      f"({config.env.dataset!r}) or set config.rl.pass_band.pool=0"
    )
  # The prompt length is fixed from env.level and pretrain.levels before the RL stage.
  known = {config.env.level, *config.pretrain.levels}
  extra = sorted(set(cfg.levels) - known)
  if extra:
    raise ConfigError(
      f"config.rl.pass_band.levels has {extra}, levels whose prompts the run's prompt length "
      f"does not cover (env.level and pretrain.levels: {sorted(known)}); add them to "
      "config.pretrain.levels"
    )


def pool_problems(ctx) -> list:
  """The pool: ``pool`` training prompts, in equal shares of ``levels`` (the remainder to the
  first ones), from the ``pass_band`` stream of the run's key."""
  cfg = ctx.config.rl.pass_band
  levels = tuple(cfg.levels) or (ctx.config.env.level,)
  key = jax.random.fold_in(ctx.key, streams.tag("pass_band"))
  out = []
  for i, level in enumerate(levels):
    n = cfg.pool // len(levels) + (1 if i < cfg.pool % len(levels) else 0)
    if n:
      out += ctx.env.sample(jax.random.fold_in(key, i), n, level=int(level), split="train")
  return out


def pass_rates(ctx, params, problems) -> np.ndarray:
  """[len(problems)] mean reward of ``samples`` responses each, at ``rl.temperature``."""
  cfg = ctx.config.rl
  k = cfg.pass_band.samples
  rows = [p for p in problems for _ in range(k)]
  sampler = samplers.make_sampler(
    ctx,
    ctx.sampler_config(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens),
    inserting=False,
  )
  key = jax.random.fold_in(jax.random.fold_in(ctx.key, streams.tag("pass_band")), 1 << 16)
  _, texts = samplers.sample_texts(
    ctx, sampler, params, ctx.prompt_texts(rows), ctx.prompt_len, key, min(len(rows), 256)
  )
  rewards = np.asarray(ctx.scorer.score(ctx.env, rows, texts, env=ctx.config.env.name)[0])
  return rewards.reshape(len(problems), k).mean(axis=1)


def in_band(rates, low: float, high: float) -> np.ndarray:
  """Whether each rate lies in ``[low, high]`` (a float tolerance of 1e-9 at both ends, so a
  rate of 3/8 is in a band from 0.375)."""
  rates = np.asarray(rates, np.float64)
  return (rates >= low - 1e-9) & (rates <= high + 1e-9)


class Band:
  """The curated pool (an ``envs.StaticDataset``) and the step metrics."""

  def __init__(self, dataset, metrics: dict):
    self.dataset, self.metrics = dataset, metrics


def build(ctx, init_params) -> Band:
  cfg = ctx.config.rl.pass_band
  problems = pool_problems(ctx)
  rates = pass_rates(ctx, init_params, problems)
  keep = in_band(rates, cfg.low, cfg.high)
  tag = f"pass_band[{cfg.low:g},{cfg.high:g}]"
  annotated = [
    records.from_problem(
      p,
      split="train",
      base_pass_rate=float(r),
      source_model="rl start",
      filters=(tag,) if kept else (),
    )
    for p, r, kept in zip(problems, rates, keep)
  ]
  stage_dir = ctx.stage_dir("rl")
  rates_path, band_path = os.path.join(stage_dir, RATES_FILE), os.path.join(stage_dir, BAND_FILE)
  if parallel.is_primary():
    os.makedirs(stage_dir, exist_ok=True)
    records.write_records(rates_path, annotated)
    records.write_records(band_path, [r for r, k in zip(annotated, keep) if k])
  parallel.barrier("pass_band_written")
  if not keep.any():
    counts = {f"{v:g}": int(np.sum(np.isclose(rates, v))) for v in np.unique(rates)}
    raise ValueError(
      f"config.rl.pass_band: no pool prompt has a start pass rate in [{cfg.low:g}, "
      f"{cfg.high:g}] (pool rates and counts: {counts}; all in {rates_path}); widen the band "
      "or draw the pool from other levels"
    )
  metrics = {
    "pass_band/kept": float(keep.sum()),
    "pass_band/kept_rate": float(rates[keep].mean()),
    "pass_band/pool_rate": float(rates.mean()),
  }
  return Band(envs.StaticDataset(band_path), metrics)


def prompts(ctx, built: Band):
  del ctx
  return built.dataset


def after_update(ctx, run, built: Band, state, record, step, scratch):
  del ctx, run, record, step, scratch
  return state, dict(built.metrics)


METHOD = hooks.Method(
  name="pass_band",
  section="rl.pass_band",
  active=active,
  doc="docs/reasoning_data.md",
  check=check,
  build=build,
  prompts=prompts,
  after_update=after_update,
  fields={"rl.pass_band": PASS_BAND},
)
