"""The ``reward_model`` stage: a Bradley-Terry reward model trained on preference pairs.

The model is the policy's decoder trunk with a scalar head (``rewards.reward_model``), started
from the pretrain stage's final parameters when that stage ran (else from the run's starting
model), or a model of ``config.reward_model.preset`` (+ ``overrides``) from scratch. It is
trained on pairs of ``config.reward_model.data`` (``train/preference_pairs.py``), or on pairs
made from the run's env when that is empty, with the loss
``-log sigmoid(r_c - r_r [- margin]) + center_coef * mean((r_c + r_r)^2)``; held-out pairs give
the pairwise accuracy and the reward mean / std stored with the model (normalisation in RL).
Checkpoints and a resume after a stop work as in pretraining; metrics go to
``WORKDIR/reward_model/metrics.jsonl``.
"""

import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from posttrain_jax import io as ptio
from posttrain_jax import models, rollout, streams
from posttrain_jax.envs import base as env_base
from posttrain_jax.rewards import reward_model as rm
from posttrain_jax.train import context as context_lib
from posttrain_jax.train import preference_pairs as pairs_lib
from posttrain_jax.train import stage_loop, updates
from posttrain_jax.train import state as state_lib

STAGE = rm.STAGE
STATS_PAIRS = 1024  # training pairs that give the reward mean / std when none are held out


# -- the model ------------------------------------------------------------------------------------
def model_section(config) -> ml_collections.ConfigDict:
  """``config.model`` with ``config.reward_model.preset`` (+ ``overrides``) in place of the
  run's preset when one is set."""
  section = ml_collections.ConfigDict(config.model.to_dict())
  rm_cfg = config.reward_model
  if rm_cfg.preset:
    section.preset, section.hf_path = rm_cfg.preset, ""
    section.overrides = ml_collections.ConfigDict(rm_cfg.overrides.to_dict())
  return section


def build_model(ctx, trunk):
  """``(graphdef, params)`` of the stage's reward model, placed on the run's mesh: the run's
  model with ``trunk``'s embedding, blocks and final norm and a fresh scalar head (normal,
  std 0.02, as the LM head's initialiser), or (with ``config.reward_model.preset``) a fresh
  model of that preset."""
  seed = ctx.config.seed + 2000  # not the policy's initialisation
  if ctx.config.reward_model.preset:
    base = state_lib.model_config(model_section(ctx.config), len(ctx.tokenizer))
    graphdef, params = models.init_decoder(rm.scalar_config(base), seed)
    return graphdef, ctx.placement.place(params)
  config = rm.scalar_config(nnx.merge(ctx.graphdef, ctx.init_params).config)
  head = 0.02 * jax.random.normal(
    jax.random.key(seed), (config.hidden_size, 1), config.jnp_param_dtype
  )
  graphdef, params = models.with_head(ctx.graphdef, trunk, head, seed)
  return graphdef, ctx.placement.place(params)


# -- data -----------------------------------------------------------------------------------------
def load_pairs(ctx) -> tuple[pairs_lib.Pairs, pairs_lib.Pairs]:
  """``(train, held-out)`` pairs: the file's, split by ``eval_fraction``, or the env's (train
  split problems to train on, eval split problems held out)."""
  cfg = ctx.config.reward_model
  if cfg.data:
    return pairs_lib.split_pairs(pairs_lib.read_pairs(cfg.data), cfg.eval_fraction, ctx.config.seed)
  key = jax.random.fold_in(ctx.key, streams.tag("reward_model"))
  held = int(round(cfg.pairs * cfg.eval_fraction))
  level = ctx.config.env.level
  train = pairs_lib.env_pairs(
    ctx.env, jax.random.fold_in(key, 0), cfg.pairs - held, level=level, split="train"
  )
  heldout = (
    pairs_lib.env_pairs(ctx.env, jax.random.fold_in(key, 1), held, level=level, split="eval")
    if held
    else train.take([])
  )
  return train, heldout


def resolve_max_len(cfg, pairs: list[pairs_lib.Pairs], tokenizer, limit: int) -> int:
  """``config.reward_model.max_len``, or (0) the longest pair's length bucketed to a power of
  two, at most ``limit`` (the model's ``max_seq_len``)."""
  if cfg.max_len:
    if cfg.max_len > limit:
      raise context_lib.ConfigError(
        f"config.reward_model.max_len={cfg.max_len} is over the reward model's "
        f"max_seq_len={limit}; lower it or raise config.model.max_seq_len"
      )
    return int(cfg.max_len)
  longest = max(
    len(ids)
    for p in pairs
    if len(p)
    for side in (p.chosen, p.rejected)
    for ids in rm.encode(tokenizer, p.prompt, side, 1 << 30)
  )
  return min(rollout.bucket_length(longest), limit)


class Encoded:
  """A set of pairs tokenised once: chosen and rejected ids, margins."""

  def __init__(self, pairs: pairs_lib.Pairs, tokenizer, max_len: int):
    self.chosen = rm.encode(tokenizer, pairs.prompt, pairs.chosen, max_len)
    self.rejected = rm.encode(tokenizer, pairs.prompt, pairs.rejected, max_len)
    self.margin = np.asarray(pairs.margin, np.float32).reshape(len(pairs))
    unk = tokenizer.unk_token_id
    for i, (c, r) in enumerate(zip(self.chosen, self.rejected)):
      if unk is not None and (unk in c or unk in r):
        raise pairs_lib.DatasetError(
          f"{pairs.where[i]}: the pair holds text the run's tokenizer does not know (it "
          f"became {tokenizer.unk_token!r}): prompt {pairs.prompt[i][:60]!r}; the "
          "tokenizer's characters come from the env (and config.env.dataset), so use "
          "pairs written in them or a model with a tokenizer of its own (config.model."
          "hf_path)"
        )

  def __len__(self) -> int:
    return len(self.chosen)

  def batch(self, index, length: int, pad_id: int) -> dict:
    """The rows ``index`` as a batch: chosen / rejected tokens [B, length], their lengths [B]
    and margins [B]."""
    chosen, chosen_len = rm.pad([self.chosen[i] for i in index], length, pad_id)
    rejected, rejected_len = rm.pad([self.rejected[i] for i in index], length, pad_id)
    return {
      "chosen": chosen,
      "chosen_len": chosen_len,
      "rejected": rejected,
      "rejected_len": rejected_len,
      "margin": self.margin[np.asarray(index, np.int64)],
    }


# -- training -------------------------------------------------------------------------------------
def make_train_step(
  graphdef,
  tx,
  *,
  center_coef: float,
  use_margin: bool,
  shardings=None,
  max_update_ratio: float = 0.0,
):
  """Jitted ``step(state, batch) -> (state, metrics)`` on the Bradley-Terry loss (one forward
  of the chosen and rejected rows together); a non-finite or exploding update is skipped."""

  def loss_fn(params, batch):
    tokens = jnp.concatenate([batch["chosen"], batch["rejected"]])
    lengths = jnp.concatenate([batch["chosen_len"], batch["rejected_len"]])
    r = rm.scores(graphdef, params, tokens, lengths)
    n = batch["chosen"].shape[0]
    loss, m = rm.bradley_terry_loss(
      r[:n], r[n:], batch["margin"] if use_margin else None, center_coef
    )
    return loss, {
      "loss/total": loss,
      "loss/bt": m["loss/bt"],
      "loss/center": m["loss/center"],
      "train/accuracy": m["accuracy"],
      "train/margin": m["margin"],
      "train/reward_mean": m["reward/mean"],
    }

  def step(state, batch):
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
    state, opt_metrics = state_lib.apply_gradients(state, grads, loss, tx, max_update_ratio)
    return state, {**metrics, **opt_metrics}

  return updates.jit_step(
    step,
    shardings,
    2,
    name="train.reward_model_step",
    static=(graphdef, center_coef, use_margin, max_update_ratio),
  )


def evaluate(
  score_fn,
  params,
  data: Encoded,
  *,
  pad_id: int,
  max_len: int,
  center_coef: float,
  use_margin: bool,
  prefix: str = "eval/",
) -> dict:
  """Metrics of ``data``'s pairs: loss, pairwise accuracy, mean margin, and the mean / std of
  every reward (chosen and rejected), as ``<prefix>name``."""
  if not len(data):
    return {}
  r_c = rm.score_ids(score_fn, params, data.chosen, pad_id=pad_id, max_len=max_len)
  r_r = rm.score_ids(score_fn, params, data.rejected, pad_id=pad_id, max_len=max_len)
  loss, m = rm.bradley_terry_loss(
    jnp.asarray(r_c),
    jnp.asarray(r_r),
    jnp.asarray(data.margin) if use_margin else None,
    center_coef,
  )
  both = np.concatenate([r_c, r_r])
  return {
    f"{prefix}loss": float(loss),
    f"{prefix}accuracy": float(m["accuracy"]),
    f"{prefix}margin": float(m["margin"]),
    f"{prefix}reward_mean": float(both.mean()),
    f"{prefix}reward_std": float(both.std()),
  }


def run(ctx: context_lib.Context, trunk=None):
  """Trains the reward model (resuming from the last checkpoint), saves it (``final``,
  ``tokenizer``, ``reward_model.json``) and returns its summary (done.json)."""
  cfg = ctx.config.reward_model
  out_dir = ctx.stage_dir(STAGE)
  tok = ctx.tokenizer
  # --- setup -----------------------------------------------------------------------------------
  graphdef, params = build_model(ctx, ctx.init_params if trunk is None else trunk)
  model_cfg = nnx.merge(graphdef, params).config
  train_pairs, held_pairs = load_pairs(ctx)
  max_len = resolve_max_len(cfg, [train_pairs, held_pairs], tok, model_cfg.max_seq_len)
  train, held = Encoded(train_pairs, tok, max_len), Encoded(held_pairs, tok, max_len)
  stats_set, stats_prefix = (
    (held, "eval/")
    if len(held)
    else (
      Encoded(train_pairs.take(range(min(STATS_PAIRS, len(train_pairs)))), tok, max_len),
      "train_eval/",
    )
  )
  place = ctx.placement
  r = context_lib.resume_stage(ctx, out_dir, params, cfg)
  state, tx, ckpt, writer = r.state, r.tx, r.ckpt, r.writer
  start, elapsed, skipped = r.start, r.elapsed, r.skipped
  use_margin, center = bool(cfg.margin), float(cfg.center_coef)
  step_fn = make_train_step(
    graphdef,
    tx,
    center_coef=center,
    use_margin=use_margin,
    shardings=place.step_shardings(place.state_shardings(params, tx), cfg.batch_size),
    max_update_ratio=float(cfg.max_update_ratio),
  )
  score_fn = rm.make_score_fn(graphdef)
  scored = dict(pad_id=tok.pad_token_id, max_len=max_len, center_coef=center, use_margin=use_margin)
  data_key = jax.random.fold_in(jax.random.fold_in(ctx.key, streams.tag("reward_model")), 2)
  bar = ptio.Progress(
    cfg.steps,
    initial=start,
    desc=STAGE,
    enabled=ctx.show_progress,
    keys=("loss/bt", "eval/accuracy"),
  )
  t0 = time.time() - elapsed

  # --- loop ------------------------------------------------------------------------------------
  def one_step(state, step):
    rng = env_base.numpy_rng(jax.random.fold_in(data_key, step))
    index = rng.integers(len(train), size=cfg.batch_size).tolist()
    batch = place.put_rows(train.batch(index, max_len, tok.pad_token_id), cfg.batch_size)
    state, metrics = step_fn(state, batch)
    return state, context_lib.as_floats(metrics)

  try:
    state = stage_loop.train_loop(
      state,
      label=STAGE,
      cfg=cfg,
      start=start,
      step=one_step,
      evaluate=lambda state: evaluate(score_fn, state.params, held, **scored),
      checkpoint=stage_loop.state_checkpoint(ckpt),
      writer=writer,
      bar=bar,
      t0=t0,
      skipped=skipped,
    )
  finally:
    ckpt.close()
  # --- finish ----------------------------------------------------------------------------------
  bar.close()
  writer.close()
  final = evaluate(score_fn, state.params, stats_set, prefix=stats_prefix, **scored)
  summary = {
    "steps": cfg.steps,
    "train_pairs": len(train),
    "heldout_pairs": len(held),
    "max_len": max_len,
    **final,
  }
  if ctx.is_primary:
    stats = {"mean": final[f"{stats_prefix}reward_mean"], "std": final[f"{stats_prefix}reward_std"]}
    if "eval/accuracy" in final:
      stats["heldout_accuracy"] = final["eval/accuracy"]
    rm.save_meta(out_dir, model_cfg, tok, max_len=max_len, stats=stats)
  ctx.save_final(STAGE, state.params, summary)
  if ctx.is_primary and "eval/accuracy" in final:
    print(
      f"[{STAGE}] held-out pairwise accuracy {final['eval/accuracy']:.3f} on {len(held)} "
      f"pairs; saved to {os.path.join(out_dir, 'final')}",
      flush=True,
    )
  return summary
