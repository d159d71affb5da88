"""Pretraining / SFT stage: masked next-token loss on an environment's corpus.

The train state lies on the run's mesh (trainer layout); each process tokenizes only its own
rows of every batch; only process 0 writes metrics.
"""

import time

import jax
import numpy as np
from flax import nnx

from posttrain_jax import io as ptio
from posttrain_jax import streams
from posttrain_jax.envs import contexts as contexts_lib
from posttrain_jax.train import context as context_lib
from posttrain_jax.train import stage_loop, teacher_model, updates


def sft_batch(
  ctx: context_lib.Context,
  key: jax.Array,
  batch_size: int,
  seq_len: int,
  noise: float,
  rows: tuple[int, int] | None = None,
) -> dict:
  """Tokens [B, L] (prompt + completion + EOS, right-padded) and the loss mask on the answer;
  only rows ``lo:hi`` of the batch when ``rows=(lo, hi)``. With
  ``config.rl.teacher.pretrain_context`` > 0 that fraction of the prompts carries the teacher's
  privileged context (``envs.contexts.context_corpus``), so a self-teacher can read it."""
  levels = tuple(ctx.config.pretrain.levels) or (ctx.config.env.level,)
  if len(levels) == 1:
    pairs = _corpus(ctx, key, batch_size, levels[0], noise)
  else:  # equal shares, level by level, each from its own key
    pairs = []
    for i, level in enumerate(levels):
      n = batch_size * (i + 1) // len(levels) - batch_size * i // len(levels)
      pairs += _corpus(ctx, jax.random.fold_in(key, level), n, level, noise) if n else []
  if rows is not None:
    pairs = pairs[rows[0] : rows[1]]
  return tokenize_pairs(ctx.tokenizer, pairs, seq_len)


def tokenize_pairs(tok, pairs, seq_len: int) -> dict:
  """(prompt text, completion text) pairs as ``tokens`` [B, seq_len] (prompt + completion + EOS,
  right-padded, cut at ``seq_len``) and ``loss_mask`` [B, seq_len], 1 on the completion and EOS
  only."""
  prompts = tok([p for p, _ in pairs], add_special_tokens=False)["input_ids"]
  answers = tok([c for _, c in pairs], add_special_tokens=False)["input_ids"]
  tokens = np.full((len(pairs), seq_len), tok.pad_token_id, np.int32)
  mask = np.zeros((len(pairs), seq_len), np.float32)
  for i, (p, a) in enumerate(zip(prompts, answers)):
    seq = (p + a + [tok.eos_token_id])[:seq_len]
    tokens[i, : len(seq)] = seq
    mask[i, len(p) : len(seq)] = 1.0
  return {"tokens": tokens, "loss_mask": mask}


def _corpus(ctx, key, n: int, level: int, noise: float) -> list[tuple[str, str]]:
  """``n`` (prompt, answer) pairs of the env's corpus at ``level``, a fraction with the
  teacher's privileged context when ``config.rl.teacher.pretrain_context`` > 0."""
  teacher = ctx.config.rl.teacher
  name, kwargs = teacher_model.pretrain_context(teacher)
  if teacher.pretrain_context > 0 and name != "none":
    return contexts_lib.context_corpus(
      ctx.env,
      key,
      n,
      level=level,
      noise=noise,
      name=name,
      fraction=float(teacher.pretrain_context),
      **kwargs,
    )
  return ctx.env.corpus(key, n, level=level, noise=noise)


def _prompt_len(ctx) -> int:
  """The longest prompt of the corpus: with ``config.rl.teacher.pretrain_context`` the
  teacher's (context + prompt), else the student's."""
  teacher = ctx.config.rl.teacher
  if teacher.pretrain_context > 0 and teacher_model.pretrain_context(teacher)[0] != "none":
    return teacher_model.context_prompt_len(ctx, ctx.config.rl, pretraining=True)
  return ctx.prompt_len


def run(ctx: context_lib.Context, *, stage: str = "pretrain", **overrides):
  """Trains from the fresh parameters; resumes from the last checkpoint; returns final params.
  ``stage``: the folder and name of the stage (``teacher``: a teacher of its own, with
  ``ctx`` holding its model); ``overrides``: ``config.pretrain`` keys set otherwise (e.g.
  ``steps``, ``corpus_noise``)."""
  cfg = ctx.config.pretrain
  if overrides:
    cfg = cfg.copy_and_resolve_references()
    cfg.update(overrides)
  out_dir = ctx.stage_dir(stage)
  # --- setup -----------------------------------------------------------------------------------
  place = ctx.placement
  r = context_lib.resume_stage(ctx, out_dir, ctx.init_params, cfg)
  state, tx, ckpt, writer = r.state, r.tx, r.ckpt, r.writer
  start, elapsed, skipped = r.start, r.elapsed, r.skipped
  step_fn = updates.make_sft_step(
    ctx.graphdef,
    tx,
    shardings=place.step_shardings(place.state_shardings(ctx.init_params, tx), cfg.batch_size),
    max_update_ratio=float(cfg.max_update_ratio),
  )
  local_rows = place.local_rows(cfg.batch_size)
  evaluator = ctx.make_evaluator(cfg.eval_problems, pass_n=0)
  seq_len = _prompt_len(ctx) + ctx.config.rl.max_new_tokens
  limit = nnx.merge(ctx.graphdef, ctx.init_params).config.max_seq_len
  if seq_len > limit:
    raise context_lib.ConfigError(
      f"pretraining sequences with the teacher's context need {seq_len} positions, over the "
      f"model's max_seq_len={limit}; set config.model.max_seq_len >= {seq_len} or shorten "
      "the context"
    )
  data_key = jax.random.fold_in(ctx.key, streams.tag("pretrain"))
  bar = ptio.Progress(
    cfg.steps,
    initial=start,
    desc=stage,
    enabled=ctx.show_progress,
    keys=("loss/nll", "eval/accuracy"),
  )
  t0 = time.time() - elapsed

  # --- loop ------------------------------------------------------------------------------------
  def one_step(state, step):
    rows = sft_batch(
      ctx, jax.random.fold_in(data_key, step), cfg.batch_size, seq_len, cfg.corpus_noise, local_rows
    )
    state, metrics = step_fn(state, place.from_local(rows, cfg.batch_size))
    return state, context_lib.as_floats(metrics)

  try:
    state = stage_loop.train_loop(
      state,
      label="pretrain",
      cfg=cfg,
      start=start,
      step=one_step,
      evaluate=lambda state: evaluator(state.params, ctx.eval_key),
      checkpoint=stage_loop.state_checkpoint(ckpt),
      writer=writer,
      bar=bar,
      t0=t0,
      skipped=skipped,
    )
  finally:
    ckpt.close()  # a save in flight (good data) completes, also when the run stops
  # --- finish ----------------------------------------------------------------------------------
  bar.close()
  writer.close()
  last = ptio.read_jsonl(writer.path)[-1] if cfg.steps and ctx.is_primary else {}
  ctx.save_final(stage, state.params, {"steps": cfg.steps, **last})
  return state.params
