"""The ``search`` stage: gradient-free search in weight space from an earlier stage's policy
(CoRP, methods_B.md section 4; RandOpt's best-of-population and ES as other rules).

Each round:

1. draws ``population`` perturbations of the flattened parameters in antithetic pairs from the
   round's seed (``objectives.perturbation.population``; after the first round, with
   ``cov_rank`` > 0, from the low-rank-plus-floor covariance of the previous round's rewarded
   directions), so a perturbation is its seed and index, never an array sent anywhere;
2. scores each perturbed policy by its mean greedy reward on ``prompts`` training problems new
   this round (the env's verifier, through the run's reward calls);
3. consolidates the population into one direction d with ``rule``
   (``objectives.CONSOLIDATIONS``: ``corp``, ``reward_mean``, ``randopt``, ``es``);
4. scores theta + alpha d for each of ``alphas`` and theta itself on ``val_prompts`` fixed
   validation problems (the training split, drawn once), and moves to the best candidate only
   if the gate (a paired bootstrap lower bound of its gain above ``margin``) accepts it.

No gradient is taken anywhere (tested with ``jax.grad`` made to raise). Rollouts are counted
(``rollouts/total``: every greedy completion the round generated) so that an arm can be matched
to GRPO at equal rollouts. The stage checkpoints after every round and resumes from there: the
rounds' rewards are in the checkpoint's meta, from which the low-rank bases are regenerated.
"""

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from posttrain_jax import io as ptio
from posttrain_jax import objectives, registry, streams
from posttrain_jax.objectives import perturbation
from posttrain_jax.train import context as context_lib


@dataclasses.dataclass
class Round:
  """What a round measured (host values)."""

  rewards: np.ndarray  # [population]
  metrics: dict


def _problems(ctx, key, n: int) -> list:
  return ctx.env.sample(key, n, level=ctx.config.env.level, split="train")


def _basis(key, cfg, dim: int, rounds_rewards: list, upto: int):
  """The covariance basis of round ``upto``: None for isotropic rounds, else the top
  ``cov_rank`` directions of round ``upto - 1``'s rewarded perturbations (regenerated from its
  seed and the bases before it), scaled by sqrt(D / r): the covariance (D / r) U U^T + lambda I
  puts as much variance in those r directions as in the whole isotropic floor at lambda = 1
  (derived: the paper gives no scale)."""
  if not cfg.cov_rank or upto == 0:
    return None
  basis = None
  for r in range(upto):
    E = perturbation.population(
      jax.random.fold_in(key, r), cfg.population, dim, cfg.sigma, basis, cfg.cov_floor
    )
    weights = jnp.maximum(perturbation.standardize(jnp.asarray(rounds_rewards[r])), 0.0)
    # scaled so the r directions carry as much variance as the D-dimensional floor (lambda=1)
    basis = perturbation.top_directions(E, weights, cfg.cov_rank) * jnp.sqrt(dim / cfg.cov_rank)
  return basis


def one_round(ctx, cfg, evaluator, theta, unravel, key, val_problems, basis, index: int) -> tuple:
  """Round ``index`` from the flat parameters ``theta``; returns (new theta, Round)."""
  dim = theta.shape[0]
  rule = registry.lookup(objectives.CONSOLIDATIONS, cfg.rule, "search rule")
  E = perturbation.population(
    jax.random.fold_in(key, 0), cfg.population, dim, cfg.sigma, basis, cfg.cov_floor
  )
  problems = _problems(ctx, jax.random.fold_in(key, 1), cfg.prompts)
  score_key = jax.random.fold_in(key, 2)
  rewards = np.array(
    [
      evaluator.scores(unravel(theta + E[i]), problems, score_key).mean()
      for i in range(cfg.population)
    ]
  )
  d, rule_metrics = rule(E, jnp.asarray(rewards, jnp.float32), **dict(cfg.rule_kwargs))
  base = evaluator.scores(unravel(theta), val_problems, score_key)
  cands = np.stack(
    [evaluator.scores(unravel(theta + a * d), val_problems, score_key) for a in cfg.alphas]
  )
  best, lower = perturbation.gate(cands, base, margin=cfg.margin, boots=cfg.boots, seed=index)
  accepted = best >= 0
  if accepted:
    theta = theta + cfg.alphas[best] * d
  overlap, chance = (
    perturbation.subspace_overlap(E, jnp.asarray(rewards), 1)
    if cfg.population >= 8
    else (np.nan, np.nan)
  )
  metrics = {
    "search/reward_mean": float(rewards.mean()),
    "search/reward_max": float(rewards.max()),
    "search/reward_std": float(rewards.std()),
    "search/val_base": float(base.mean()),
    "search/val_best": float(cands.mean(axis=1).max()),
    "search/gain_lower": lower,
    "search/accepted": float(accepted),
    "search/alpha": float(cfg.alphas[best]) if accepted else 0.0,
    "search/direction_norm": float(jnp.linalg.norm(d)),
    "search/split_half_overlap": float(overlap),
    "search/split_half_chance": float(chance),
    "rollouts/generated": float(
      cfg.population * cfg.prompts + (len(cfg.alphas) + 1) * cfg.val_prompts
    ),
    **context_lib.as_floats(rule_metrics),
  }
  return theta, Round(rewards, metrics)


def run(ctx: context_lib.Context, start_params, *, stage: str = "search"):
  """Searches from ``start_params`` for ``config.search.rounds`` rounds; resumes from its
  checkpoints; returns the final parameters."""
  cfg = ctx.config.search  # validated (train/validate.py): the rule, even population
  out_dir = ctx.stage_dir(stage)
  key = jax.random.fold_in(ctx.key, streams.tag("search"))
  flat, unravel = ravel_pytree(start_params)
  evaluator = ctx.make_evaluator(cfg.eval_problems, pass_n=0)
  scorer = dataclasses.replace(evaluator, batch_size=max(cfg.prompts, cfg.val_prompts))
  val_problems = _problems(ctx, jax.random.fold_in(key, 1 << 20), cfg.val_prompts)
  ckpt = ptio.Checkpointer(os.path.join(out_dir, "checkpoints"), max_to_keep=2, async_save=True)
  writer = ptio.MetricWriter(out_dir, tensorboard=ctx.config.tensorboard, enabled=ctx.is_primary)
  start, rollouts, history, elapsed = 0, 0.0, [], 0.0
  restored = ckpt.restore_latest(start_params, fallback=ctx.fallback_checkpoint)
  if restored is not None:
    params, meta = restored
    flat = ravel_pytree(params)[0]
    start, rollouts, history = meta["step"], meta["rollouts"], meta["rewards"]
    elapsed = meta.get("elapsed", 0.0)
  writer.resume(start)
  if start == 0 and cfg.eval_every:
    writer.write(0, evaluator(start_params, ctx.eval_key))
  bar = ptio.Progress(
    cfg.rounds,
    initial=start,
    desc=stage,
    enabled=ctx.show_progress,
    keys=("search/val_base", "eval/accuracy"),
  )
  t0 = time.time() - elapsed
  try:
    for r in range(start, cfg.rounds):
      basis = _basis(key, cfg, flat.shape[0], history, r)
      flat, rnd = one_round(
        ctx, cfg, scorer, flat, unravel, jax.random.fold_in(key, r), val_problems, basis, r
      )
      history.append(rnd.rewards.tolist())
      rollouts += rnd.metrics["rollouts/generated"]
      record = {**rnd.metrics, "rollouts/total": rollouts}
      done = r + 1
      if cfg.eval_every and (done % cfg.eval_every == 0 or done == cfg.rounds):
        record.update(evaluator(unravel(flat), ctx.eval_key))
      record["time/elapsed"] = time.time() - t0
      writer.write(done, record)
      bar.update(record)
      meta = {
        "step": done,
        "rollouts": rollouts,
        "rewards": history,
        "elapsed": record["time/elapsed"],
      }
      ckpt.save(done, unravel(flat), meta)
  finally:
    ckpt.close()
  bar.close()
  writer.close()
  final = unravel(flat)
  last = ptio.read_jsonl(writer.path)[-1] if ctx.is_primary and cfg.rounds else {}
  ctx.save_final(stage, final, {"steps": cfg.rounds, **last})
  return final
