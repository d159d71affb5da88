"""The ``sft`` stage: supervised fine-tuning on gold solutions, from an earlier stage's policy.

The data is a fixed set of (prompt, completion) examples: ``config.sft.examples`` gold
transcripts of the env (its noise-free corpus at ``config.sft.level``), or the lines of a JSONL
file (``config.sft.source``), one example a line in the prompt-completion layout TRL uses::

    {"prompt": "12+7=", "completion": "19"}

Prompts go through the tokenizer's chat template when ``config.model.chat_template`` is set
(the same text the RL stage's prompts are); the loss is the mean negative log-likelihood of the
completion's tokens and the EOS after it, never the prompt's. Training runs ``epochs`` passes,
each over a fresh seeded permutation of the examples in batches of ``batch_size`` (the last
batch of a pass filled from the pass's first examples, so every example is seen at least once
a pass), with an optimiser of its own (``config.sft``'s lr, schedule, warm-up, weight decay
and clipping). It resumes from its checkpoints like pretraining.
"""

import math
import os

import jax
import numpy as np
from flax import nnx

from posttrain_jax import streams
from posttrain_jax.envs import records
from posttrain_jax.envs.base import DatasetError, json_lines
from posttrain_jax.train import context as context_lib
from posttrain_jax.train import pretrain, stage_loop, updates

ENV = "env"  # config.sft.source: the env's gold transcripts


def read_examples(path: str) -> list[tuple[str, str]]:
  """The (prompt, completion) pairs of a JSONL file (``{"prompt", "completion"}`` lines or
  reasoning-data records, envs/records.py); ``DatasetError`` naming ``path:LINE`` for a line
  that is neither, and for a missing or empty file."""
  if not os.path.isfile(path):
    raise DatasetError(
      f"config.sft.source={path!r} is no file; give a JSONL file of "
      '{"prompt": ..., "completion": ...} lines, or "env" for the env\'s gold solutions'
    )
  out = []
  for lineno, record in json_lines(path):
    if not isinstance(record, dict):
      raise DatasetError(f"{path}:{lineno}: a line must be a JSON object, got {record!r:.60}")
    if records.is_record(record):  # a reasoning-data record: its prompt and behaviour
      out.append(records.to_pair(records.validate(record, f"{path}:{lineno}")))
      continue
    prompt, completion = record.get("prompt"), record.get("completion")
    if not isinstance(prompt, str):
      raise DatasetError(f'{path}:{lineno}: needs a string "prompt", got {prompt!r:.60}')
    if not isinstance(completion, str) or not completion:
      raise DatasetError(
        f'{path}:{lineno}: needs a non-empty string "completion", got {completion!r:.60}'
      )
    out.append((prompt, completion))
  if not out:
    raise DatasetError(f"{path} holds no examples; write one JSON object per line")
  return out


def data_key(ctx: context_lib.Context) -> jax.Array:
  return jax.random.fold_in(ctx.key, streams.tag("sft"))


def examples(ctx: context_lib.Context, cfg) -> list[tuple[str, str]]:
  """The stage's examples as (prompt text, completion): the env's ``cfg.examples`` gold
  transcripts or the file's lines, each prompt through the chat template when it is set."""
  if cfg.source == ENV:
    key = data_key(ctx)
    level = cfg.level or ctx.config.env.level
    pairs = ctx.env.corpus(key, cfg.examples, level=level, noise=float(cfg.noise))
  else:
    pairs = read_examples(cfg.source)
  return [(context_lib.prompt_text(ctx.tokenizer, p, ctx.chat_template), c) for p, c in pairs]


def check_vocabulary(tok, pairs, where: str) -> None:
  """DatasetError when an example has text the tokenizer maps to its unknown token (a char
  tokenizer built for another env's characters)."""
  unk = tok.unk_token_id
  if unk is None:
    return
  for i, (p, c) in enumerate(pairs):
    ids = tok([p + c], add_special_tokens=False)["input_ids"][0]
    if unk in ids:
      known = set(tok.get_vocab())
      missing = sorted({ch for ch in p + c if ch not in known})
      raise DatasetError(
        f"{where}: example {i + 1} has characters the tokenizer does not know "
        f"({''.join(missing)!r}); write the examples in the env's characters or use a "
        "Hugging Face tokenizer (config.model.hf_path)"
      )


def sequence_length(tok, pairs) -> int:
  """The longest example in tokens (prompt + completion + EOS)."""
  ids = tok([p + c for p, c in pairs], add_special_tokens=False)["input_ids"]
  return max(len(x) for x in ids) + 1


def steps_per_epoch(num_examples: int, batch_size: int) -> int:
  return math.ceil(num_examples / batch_size)


def batch_indices(key: jax.Array, step: int, num_examples: int, batch_size: int) -> np.ndarray:
  """The examples of ``step``: pass ``step // steps_per_epoch`` over a permutation drawn from
  ``fold_in(key, 1 + pass)``, ``batch_size`` at a time; the pass's last batch wraps to its
  start."""
  per = steps_per_epoch(num_examples, batch_size)
  epoch, i = divmod(step, per)
  order = np.asarray(jax.random.permutation(jax.random.fold_in(key, 1 + epoch), num_examples))
  return np.take(order, np.arange(i * batch_size, (i + 1) * batch_size), mode="wrap")


def run(ctx: context_lib.Context, start_params, *, stage: str = "sft"):
  """Fine-tunes ``start_params`` on the stage's examples; resumes from its checkpoints;
  returns the final parameters."""
  cfg = ctx.config.sft.copy_and_resolve_references()
  pairs = examples(ctx, cfg)
  tok = ctx.tokenizer
  where = "the env's gold solutions" if cfg.source == ENV else cfg.source
  check_vocabulary(tok, pairs, where)
  seq_len = sequence_length(tok, pairs)
  limit = nnx.merge(ctx.graphdef, start_params).config.max_seq_len
  if seq_len > limit:
    raise DatasetError(
      f"{where}: the longest example takes {seq_len} tokens, over the model's "
      f"max_seq_len={limit}; shorten the examples or raise config.model.max_seq_len"
    )
  with cfg.unlocked():
    cfg.steps = cfg.epochs * steps_per_epoch(len(pairs), cfg.batch_size)
  out_dir = ctx.stage_dir(stage)
  place = ctx.placement
  r = context_lib.resume_stage(ctx, out_dir, start_params, cfg)
  step_fn = updates.make_sft_step(
    ctx.graphdef,
    r.tx,
    shardings=place.step_shardings(place.state_shardings(start_params, r.tx), cfg.batch_size),
    max_update_ratio=float(cfg.max_update_ratio),
  )
  lo, hi = place.local_rows(cfg.batch_size)
  evaluator = ctx.make_evaluator(cfg.eval_problems, pass_n=0)
  key = data_key(ctx)

  def one_step(state, step):
    index = batch_indices(key, step, len(pairs), cfg.batch_size)[lo:hi]
    rows = pretrain.tokenize_pairs(tok, [pairs[i] for i in index], seq_len)
    state, metrics = step_fn(state, place.from_local(rows, cfg.batch_size))
    metrics = context_lib.as_floats(metrics)
    metrics["sft/epoch"] = (step + 1) / steps_per_epoch(len(pairs), cfg.batch_size)
    return state, metrics

  state, last = stage_loop.supervised(ctx, stage, cfg, r, one_step, evaluator, keys=("loss/nll",))
  ctx.save_final(stage, state.params, {"steps": cfg.steps, "examples": len(pairs), **last})
  return state.params
