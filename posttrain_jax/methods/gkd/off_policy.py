"""GKD's on-policy fraction ``lambda`` (Agarwal et al. 2024, "On-policy distillation of language
models"; TRL's ``GKDConfig.lmbda``): during the distillation phase, each step is on-policy (the
student's own samples) with probability ``config.rl.teacher.lmbda``, and otherwise off-policy:
the distillation loss is taken on the data's sequences, here each problem's reference answer.

An off-policy step keeps the step's prompts and row layout, replaces every row's completion by
its problem's reference answer followed by EOS (cut to the completion budget: then marked
truncated) and recomputes the behaviour log-probs with the policy, so the update, the teacher's
forward and the ``teacher/kl`` diagnostic all read the answer's tokens. The rewards stay the
sampled rows' (the policy-gradient term is off in that phase: ``teacher.pg_during=False`` is
required). The coin of step ``s`` is drawn from the step's key, so a resumed run draws the same.
"""

import jax
import numpy as np

from posttrain_jax import parallel, streams


def off_policy(cfg, step: int, key) -> bool:
  """Whether step ``step`` (0-based) of the run is an off-policy GKD step: inside the
  distillation phase (``teacher.loss`` set, ``step < teacher.steps`` or every step with 0) and
  a uniform draw from ``key`` at or above ``teacher.lmbda``."""
  t = cfg.teacher
  if not t.loss or float(t.lmbda) >= 1.0 or (t.steps and step >= t.steps):
    return False
  return float(jax.random.uniform(jax.random.fold_in(key, streams.tag("gkd_coin")))) >= float(
    t.lmbda
  )


def answer_completions(tokenizer, answers: list[str], width: int) -> tuple[np.ndarray, ...]:
  """``(tokens [N, width] int32, mask [N, width] float32, lengths [N] int32, truncated [N]
  bool)``: each answer's ids then EOS, right-padded with the pad id; an answer longer than the
  budget keeps its first ``width`` ids and is marked truncated (no EOS)."""
  ids = tokenizer(list(answers), add_special_tokens=False)["input_ids"] if answers else []
  n = len(ids)
  tokens = np.full((n, width), tokenizer.pad_token_id or 0, np.int32)
  mask = np.zeros((n, width), np.float32)
  lengths = np.zeros((n,), np.int32)
  truncated = np.zeros((n,), bool)
  for i, row in enumerate(ids):
    row = list(row) + [tokenizer.eos_token_id]
    if len(row) > width:
      row, truncated[i] = row[:width], True
    tokens[i, : len(row)], mask[i, : len(row)], lengths[i] = row, 1.0, len(row)
  return tokens, mask, lengths, truncated


def with_reference_answers(ctx, run, gen, params):
  """``gen`` (``sampling.Generated``) with every row's completion replaced by its problem's
  reference answer and the policy's log-probs of it (``params``: the full policy)."""
  ro, sel = gen.ro, gen.sel
  rows, width = ro.completion_mask.shape
  lo, hi = ctx.placement.local_rows(rows)
  group = np.asarray(sel.group)[lo:hi]
  answers = [sel.problems[g].answer for g in group]
  comp, mask, lengths, trunc = answer_completions(ctx.tokenizer, answers, width)
  put = lambda x: ctx.placement.from_local(x, rows)
  prompt = parallel.local_rows(ro.tokens)[:, : ro.prompt_len]
  tokens = put(np.concatenate([np.asarray(prompt), comp], axis=1).astype(np.int32))
  new = ro.replace(
    tokens=tokens, completion_mask=put(mask), lengths=put(lengths), truncated=put(trunc)
  )
  logprobs = run.fns.trainer_logprobs(params, new.tokens, new.start, None) * new.completion_mask
  return gen._replace(ro=new.replace(logprobs=logprobs, routes=None))
