"""The ``preference`` stage: DPO, IPO, SimPO or KTO on preference pairs, from an earlier stage.

The pairs are a JSONL file of ``{"prompt", "chosen", "rejected"}`` lines
(``config.preference.source``, TRL's explicit-prompt layout, read by
``train/preference_pairs.py``) or ``config.preference.pairs`` pairs made from the env's
verifier (``source='env'``: the reference answer against a wrong answer the verifier rejects,
the reward-model stage's pair builder). Prompts go through the chat template when
``config.model.chat_template`` is set.

The frozen reference is the stage's start (the policy it continues from, e.g. the SFT stage's);
each step runs the policy and the reference over the chosen and rejected completions, sums
each completion's token log-probabilities (EOS included, the prompt never; ``average``: their
mean instead) and hands them to ``config.preference.loss``, a ``PREFERENCE_LOSSES`` entry
(``objectives/preference.py``), with ``beta`` and ``loss_kwargs``. Passes over a seeded
permutation, its own optimiser, checkpoints and resume as in the sft stage.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from posttrain_jax import models, objectives, streams
from posttrain_jax.train import context as context_lib
from posttrain_jax.train import preference_pairs as pairs_lib
from posttrain_jax.train import pretrain, sft, stage_loop, updates
from posttrain_jax.train.state import apply_gradients

ENV = "env"  # config.preference.source: pairs from the env's verifier
FIELD = "config.preference.source"


def data_key(ctx) -> jax.Array:
  return jax.random.fold_in(ctx.key, streams.tag("preference"))


def load_pairs(ctx, cfg) -> pairs_lib.Pairs:
  """The stage's pairs, each prompt through the chat template when it is set."""
  if cfg.source == ENV:
    level = cfg.level or ctx.config.env.level
    pairs = pairs_lib.env_pairs(
      ctx.env, data_key(ctx), cfg.pairs, level=level, split="train", field=FIELD
    )
  else:
    pairs = pairs_lib.read_pairs(cfg.source, field=FIELD)
  prompts = tuple(
    context_lib.prompt_text(ctx.tokenizer, p, ctx.chat_template) for p in pairs.prompt
  )
  return pairs_lib.Pairs(prompts, pairs.chosen, pairs.rejected, pairs.margin, pairs.where)


def completion_logprobs(graphdef, params, tokens, mask, average: bool):
  """Each row's completion log-probability under ``params``: the sum over the tokens whose
  ``mask`` is 1 (``tokenize_pairs``' completion + EOS; the first token is never predicted) or,
  with ``average``, their mean. Returns ``(logp [B], lengths [B])``."""
  model = nnx.merge(graphdef, params)
  logits = model(tokens[:, :-1]).logits
  lp = models.gather_logprobs(logits, tokens[:, 1:])
  m = mask[:, 1:].astype(jnp.float32)
  lengths = jnp.sum(m, axis=-1)
  total = jnp.sum(lp * m, axis=-1)
  return (total / jnp.maximum(lengths, 1.0) if average else total), lengths


def make_preference_step(
  graphdef,
  tx,
  *,
  loss: str,
  hparams: tuple,
  average: bool,
  shardings=None,
  ref_shardings=None,
  max_update_ratio: float = 0.0,
):
  """``step(state, batch, ref_params) -> (state, metrics)``; batch holds ``chosen``,
  ``chosen_mask``, ``rejected``, ``rejected_mask`` [B, L]. The loss is
  ``PREFERENCE_LOSSES[loss](chosen, rejected, ref_chosen, ref_rejected, chosen_len,
  rejected_len, **hparams)`` on completion log-probs (:func:`completion_logprobs`);
  ``ref_params`` is the frozen reference (no gradient)."""
  fn = objectives.PREFERENCE_LOSSES[loss]
  kwargs = dict(hparams)

  def both(params, batch):
    tokens = jnp.concatenate([batch["chosen"], batch["rejected"]])
    mask = jnp.concatenate([batch["chosen_mask"], batch["rejected_mask"]])
    logp, lengths = completion_logprobs(graphdef, params, tokens, mask, average)
    n = batch["chosen"].shape[0]
    return logp[:n], logp[n:], lengths[:n], lengths[n:]

  def loss_fn(params, batch, ref_params):
    c, r, lc, lr = both(params, batch)
    rc, rr, _, _ = jax.tree.map(jax.lax.stop_gradient, both(ref_params, batch))
    value, metrics = fn(c, r, rc, rr, lc, lr, **kwargs)
    return value, {"loss/preference": value, **metrics}

  def step(state, batch, ref_params):
    (value, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      state.params, batch, ref_params
    )
    state, opt_metrics = apply_gradients(state, grads, value, tx, max_update_ratio)
    return state, {**metrics, **opt_metrics}

  extra = (ref_shardings,) if shardings is not None else ()
  return updates.jit_step(
    step,
    shardings,
    3,
    extra,
    name="train.preference_step",
    static=(graphdef, loss, hparams, average, max_update_ratio),
  )


def hparams(cfg) -> tuple:
  """The loss's keywords as sorted pairs: ``beta`` and ``loss_kwargs``."""
  return tuple(sorted({"beta": float(cfg.beta), **cfg.loss_kwargs.to_dict()}.items()))


def run(ctx: context_lib.Context, start_params, *, stage: str = "preference"):
  """Trains ``start_params`` on the stage's pairs against itself as the frozen reference;
  resumes from its checkpoints; returns the final parameters."""
  cfg = ctx.config.preference.copy_and_resolve_references()
  pairs = load_pairs(ctx, cfg)
  tok = ctx.tokenizer
  where = "the env's pairs" if cfg.source == ENV else cfg.source
  chosen = list(zip(pairs.prompt, pairs.chosen))
  rejected = list(zip(pairs.prompt, pairs.rejected))
  sft.check_vocabulary(tok, chosen + rejected, where)
  seq_len = max(sft.sequence_length(tok, chosen), sft.sequence_length(tok, rejected))
  limit = nnx.merge(ctx.graphdef, start_params).config.max_seq_len
  if seq_len > limit:
    raise pairs_lib.DatasetError(
      f"{where}: the longest pair takes {seq_len} tokens, over the model's "
      f"max_seq_len={limit}; shorten the pairs or raise config.model.max_seq_len"
    )
  per_epoch = sft.steps_per_epoch(len(pairs), cfg.batch_size)
  with cfg.unlocked():
    cfg.steps = cfg.epochs * per_epoch
  place = ctx.placement
  r = context_lib.resume_stage(ctx, ctx.stage_dir(stage), start_params, cfg)
  step_fn = make_preference_step(
    ctx.graphdef,
    r.tx,
    loss=cfg.loss,
    hparams=hparams(cfg),
    average=bool(cfg.average),
    shardings=place.step_shardings(place.state_shardings(start_params, r.tx), cfg.batch_size),
    ref_shardings=place.param_shardings(start_params),
    max_update_ratio=float(cfg.max_update_ratio),
  )
  lo, hi = place.local_rows(cfg.batch_size)
  evaluator = ctx.make_evaluator(cfg.eval_problems, pass_n=0)
  key = data_key(ctx)

  def one_step(state, step):
    index = sft.batch_indices(key, step, len(pairs), cfg.batch_size)[lo:hi]
    c = pretrain.tokenize_pairs(tok, [chosen[i] for i in index], seq_len)
    j = pretrain.tokenize_pairs(tok, [rejected[i] for i in index], seq_len)
    rows = {
      "chosen": c["tokens"],
      "chosen_mask": c["loss_mask"],
      "rejected": j["tokens"],
      "rejected_mask": j["loss_mask"],
    }
    state, metrics = step_fn(state, place.from_local(rows, cfg.batch_size), start_params)
    metrics = context_lib.as_floats(metrics)
    metrics["preference/epoch"] = (step + 1) / per_epoch
    return state, metrics

  state, last = stage_loop.supervised(
    ctx, stage, cfg, r, one_step, evaluator, keys=("loss/preference",)
  )
  ctx.save_final(stage, state.params, {"steps": cfg.steps, "pairs": len(pairs), **last})
  return state.params


__all__ = ["completion_logprobs", "load_pairs", "make_preference_step", "run"]
