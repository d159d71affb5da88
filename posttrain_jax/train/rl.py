"""The RL stage: P prompts x G rollouts, rewards, advantages, jitted updates (DESIGN.md section 3).

Every random draw of step ``s`` comes from ``fold_in(run_key, s)``, so a run killed and resumed
from a checkpoint draws the same prompts and samples as an uninterrupted one.
"""

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from posttrain_jax import io as ptio
from posttrain_jax import objectives
from posttrain_jax import rollout
from posttrain_jax.train import context as context_lib
from posttrain_jax.train import state as state_lib
from posttrain_jax.train import steps


def score_completions(env, problems, texts) -> tuple[np.ndarray, int]:
  """Rewards [B] float32 from ``env.verify``; a verifier that raises scores 0 and is counted."""
  rewards, errors = np.zeros(len(texts), np.float32), 0
  for i, (p, t) in enumerate(zip(problems, texts)):
    try:
      rewards[i] = float(env.verify(p, t))
    except Exception:  # a broken reward must not kill a long run; it is counted and logged
      errors += 1
  return rewards, errors


def loss_config(cfg) -> steps.RLLossConfig:
  return steps.RLLossConfig(
      policy_loss=cfg.policy_loss,
      policy_loss_kwargs=tuple(sorted(dict(cfg.policy_loss_kwargs).items())),
      aggregation=cfg.aggregation, norm_length=cfg.get("norm_length", None),
      kl_coef=cfg.kl_coef, kl_estimator=cfg.kl_estimator, entropy_coef=cfg.entropy_coef,
      temperature=cfg.temperature, epochs=cfg.epochs, minibatches=cfg.minibatches)


class _Pieces:
  """The jitted functions of one RL run."""

  def __init__(self, ctx: context_lib.Context, tx):
    cfg = ctx.config.rl
    self.sample = rollout.make_sampler(ctx.graphdef, ctx.sampler_config(
        temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, top_k=cfg.top_k,
        top_p=cfg.top_p))
    self.update = steps.make_rl_update(ctx.graphdef, tx, ctx.prompt_len, loss_config(cfg))
    self.advantages = steps.make_advantage_fn(
        cfg.advantage, tuple(sorted(dict(cfg.advantage_kwargs).items())), cfg.prompts_per_step)
    self.ref_logprobs = None
    if cfg.kl_coef:
      self.ref_logprobs = steps.make_logprob_fn(ctx.graphdef, ctx.prompt_len, cfg.temperature)


def rl_iteration(ctx, pieces: _Pieces, state, ref_params, key) -> tuple:
  """One iteration: prompts -> rollouts -> rewards -> advantages -> update. Returns (state, metrics)."""
  cfg = ctx.config.rl
  P, G = cfg.prompts_per_step, cfg.group_size
  problems = ctx.env.sample(jax.random.fold_in(key, 0), P, level=ctx.config.env.level,
                            split="train")
  tokens, mask = rollout.encode_prompts(ctx.tokenizer, [p.prompt for p in problems],
                                        length=ctx.prompt_len)
  group = np.repeat(np.arange(P, dtype=np.int32), G)
  ro = pieces.sample(state.params, np.repeat(tokens, G, 0), np.repeat(mask, G, 0),
                     jax.random.fold_in(key, 1))
  ro = ro.replace(group=jnp.asarray(group), policy_version=jnp.broadcast_to(state.step, group.shape))
  texts = rollout.decode_completions(ctx.tokenizer, np.asarray(ro.completion))
  rewards, errors = score_completions(ctx.env, [problems[g] for g in group], texts)
  adv, adv_metrics = pieces.advantages(objectives.AdvantageInputs(
      rewards=jnp.asarray(rewards), group=jnp.asarray(group),
      valid=jnp.ones(rewards.shape, jnp.float32), mask=ro.completion_mask,
      logprobs=ro.logprobs))
  batch = {"tokens": ro.tokens, "start": ro.start, "mask": ro.completion_mask,
           "old_logprobs": ro.logprobs, "advantages": adv,
           "ref_logprobs": jnp.zeros_like(ro.logprobs)}
  if pieces.ref_logprobs is not None:
    batch["ref_logprobs"] = pieces.ref_logprobs(ref_params, ro.tokens, ro.start)
  state, metrics = pieces.update(state, batch, jax.random.fold_in(key, 2))
  record = context_lib.as_floats({**metrics, **adv_metrics})
  record.update({
      "reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()),
      "reward/errors": float(errors),
      "gen/len_mean": float(np.asarray(ro.lengths).mean()),
      "gen/truncated": float(np.asarray(ro.truncated).mean()),
  })
  return state, record


def run(ctx: context_lib.Context, init_params):
  """GRPO-family training from ``init_params``; resumes from the last checkpoint."""
  cfg = ctx.config.rl
  out_dir = ctx.stage_dir("rl")
  # --- setup -----------------------------------------------------------------------------------
  tx = state_lib.make_optimizer(**state_lib.optimizer_kwargs(cfg))
  state = state_lib.init_state(init_params, tx)
  ref_params = jax.tree.map(jnp.copy, init_params) if cfg.kl_coef else None
  ckpt = ptio.Checkpointer(os.path.join(out_dir, "checkpoints"), max_to_keep=2)
  writer = ptio.MetricWriter(out_dir, tensorboard=ctx.config.get("tensorboard", True))
  start, elapsed, nonfinite = 0, 0.0, 0
  if ckpt.latest_step() is not None:
    state, meta = ckpt.restore(state)
    start, elapsed, nonfinite = meta["step"], meta.get("elapsed", 0.0), meta.get("nonfinite", 0)
    writer.truncate_after(start)
  pieces = _Pieces(ctx, tx)
  evaluator = ctx.make_evaluator(cfg.eval_problems, pass_n=0)
  run_key = jax.random.fold_in(ctx.key, context_lib.RL_STREAM)
  bar = ptio.Progress(cfg.steps, initial=start, desc="rl", enabled=ctx.show_progress,
                      keys=("reward/mean", "eval/accuracy"))
  if start == 0 and cfg.eval_every:
    writer.write(0, evaluator(state.params, ctx.eval_key))
  t0 = time.time() - elapsed
  # --- loop ------------------------------------------------------------------------------------
  for step in range(start, cfg.steps):
    state, record = rl_iteration(ctx, pieces, state, ref_params, jax.random.fold_in(run_key, step))
    done = step + 1
    nonfinite = nonfinite + 1 if record["train/skipped"] >= cfg.epochs * cfg.minibatches else 0
    if nonfinite >= cfg.max_nonfinite_steps:
      raise context_lib.TrainingError(
          f"rl: loss or gradient non-finite in every update for {nonfinite} steps in a row "
          f"(last at step {done}); lower config.rl.lr or set config.rl.grad_clip")
    if cfg.eval_every and (done % cfg.eval_every == 0 or done == cfg.steps):
      record.update(evaluator(state.params, ctx.eval_key))
    record["time/elapsed"] = time.time() - t0
    writer.write(done, record)
    bar.update(record)
    if done % cfg.checkpoint_every == 0 or done == cfg.steps:
      ckpt.save(done, state, {"step": done, "elapsed": record["time/elapsed"],
                              "nonfinite": nonfinite})
  # --- finish ----------------------------------------------------------------------------------
  bar.close()
  ckpt.close()
  writer.close()
  last = ptio.read_jsonl(writer.path)[-1] if cfg.steps else {}
  ctx.save_final("rl", state.params, {"steps": cfg.steps, **last})
  return state.params
