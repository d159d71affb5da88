"""DenoiseRL (methods_B.md section 15): rollouts that continue from a weak model's wrong partial
answers (``config.rl.denoise``; docs/denoise.md).

Each RL step, for every prompt of the batch the weak model (the ``teacher`` stage's final
parameters: the same preset pretrained ``rl.teacher.pretrain_steps`` steps, an early checkpoint's
stand-in) samples up to ``tries`` answers at T = 1; the first one its verifier scores 0 is the
prompt's wrong trace. Its first ``round(rho * k)`` steps (of its ``k`` steps, each ending in
``boundary``; at least one step when ``rho > 0``) are the prefix. The last
``round(fraction * G)`` rows of the prompt's group continue from it (the prefix is written into
their completion by the multi-turn sampler, ``Rollout.env_mask``); the other rows start clean.
The group's advantages are GRPO's over all its rows, clean and noisy.

- Reward: the verifier on the continuation alone (the prefix's tokens are left out of the text),
  so an answer inside the prefix never counts.
- Loss: on the continuation's tokens only (``mask_prefix``, the paper's), or with
  ``mask_prefix=False`` on the prefix's tokens too (the ablation the paper warns is unstable;
  its old log-probs are then the trainer's, ``rl.old_logprobs='recomputed'``).
- ``rho = 0`` or ``fraction = 0`` gives no prefix: GRPO on the same sampler.

Choices marked *ours* in methods_B.md (the mix ratio, the rho value, the cut at step
boundaries, the weak model's online sampling) are config keys here.
"""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

from posttrain_jax import parallel, rollout, streams
from posttrain_jax.registry import ConfigError
from posttrain_jax.train import samplers, teacher_model


def cut_prefix(text: str, rho: float, boundary: str) -> str:
  """The first ``round(rho * k)`` steps of ``text`` (its ``k`` complete steps, each ending in
  ``boundary``), at least one when ``rho > 0`` and ``k > 0``; '' for ``rho = 0`` or a text with
  no complete step. With an empty ``boundary`` every character is a step."""
  if rho <= 0:
    return ""
  if not boundary:
    n = max(1, int(round(rho * len(text))))
    return text[:n] if text else ""
  ends = [i + len(boundary) for i in range(len(text)) if text.startswith(boundary, i)]
  if not ends:
    return ""
  n = min(len(ends), max(1, int(round(rho * len(ends)))))
  return text[: ends[n - 1]]


def noisy_rows(group: np.ndarray, fraction: float) -> np.ndarray:
  """[R] bool: the last ``round(fraction * G_g)`` rows of each prompt's group (``group`` [R]:
  each row's prompt index)."""
  out = np.zeros(len(group), bool)
  for g in np.unique(group):
    rows = np.flatnonzero(group == g)
    n = int(round(fraction * len(rows)))
    if n:
      out[rows[len(rows) - n :]] = True
  return out


@dataclasses.dataclass
class Weak:
  """The weak model: its jitted sampler (T = 1) and final parameters."""

  sample: object
  params: object


def build(ctx) -> Weak | None:
  """The weak model of a run with ``config.rl.denoise.enabled`` (None otherwise): the
  ``teacher`` stage's final parameters."""
  d, t = ctx.config.rl.denoise, ctx.config.rl.teacher
  if not d.enabled:
    return None
  if t.source != "stage":
    raise ConfigError(
      "config.rl.denoise needs its weak model from the teacher stage: set "
      "config.rl.teacher.source='stage' (with pretrain_steps, loss='') and put "
      "'teacher' in config.stages"
    )
  graphdef, target = teacher_model.stage_model(ctx)
  params = teacher_model.restore_final(
    os.path.join(ctx.workdir, teacher_model.STAGE, "final"), target, ctx.placement
  )
  cfg = ctx.sampler_config(temperature=1.0, max_new_tokens=ctx.config.rl.max_new_tokens)
  return Weak(rollout.make_sampler(graphdef, cfg, mesh=ctx.rollout_mesh), params)


def wrong_traces(ctx, weak: Weak, env, problems, key, tries: int) -> list[str | None]:
  """Per problem, the first of ``tries`` weak-model answers its verifier scores 0 (None when
  every try was right)."""
  rows = [p for p in problems for _ in range(tries)]
  tokens, mask = rollout.encode_prompts(
    ctx.tokenizer, ctx.prompt_texts(rows), length=ctx.prompt_len
  )
  ro = weak.sample(weak.params, tokens, mask, key)
  texts = rollout.decode_completions(ctx.tokenizer, parallel.to_host(ro.completion))
  scores, _ = ctx.scorer.score(env, rows, texts, env=ctx.config.env.name)
  out = []
  for i in range(len(problems)):
    wrong = [texts[i * tries + j] for j in range(tries) if scores[i * tries + j] <= 0]
    out.append(wrong[0] if wrong else None)
  return out


def prefixes(ctx, weak: Weak, env, problems, group, key, *, rho: float, fraction: float):
  """The step's prefixes: ``(ids [R, Q] int32, lengths [R] int32, metrics)`` for the rows of
  ``problems`` (one per prompt) laid out by ``group`` [R]; ``Q`` is the budget
  ``rl.max_new_tokens``."""
  d = ctx.config.rl.denoise
  R, Q = len(group), int(ctx.config.rl.max_new_tokens)
  ids, lengths = np.zeros((R, Q), np.int32), np.zeros(R, np.int32)
  noisy = noisy_rows(np.asarray(group), fraction)
  if not noisy.any() or rho <= 0:
    return ids, lengths, {"denoise/noisy_rows": 0.0, "denoise/prefix_tokens": 0.0}
  traces = wrong_traces(
    ctx, weak, env, problems, jax.random.fold_in(key, streams.tag("denoise_weak")), int(d.tries)
  )
  cut = [None if t is None else cut_prefix(t, rho, d.boundary) for t in traces]
  encoded = [
    None if not c else ctx.tokenizer(c, add_special_tokens=False)["input_ids"][: Q - 1] for c in cut
  ]
  for r in np.flatnonzero(noisy):
    e = encoded[int(group[r])]
    if e:
      ids[r, : len(e)], lengths[r] = e, len(e)
  return (
    ids,
    lengths,
    {
      "denoise/noisy_rows": float((lengths > 0).mean()),
      "denoise/prefix_tokens": float(lengths[lengths > 0].mean()) if (lengths > 0).any() else 0.0,
      "denoise/weak_wrong": float(np.mean([t is not None for t in traces])),
    },
  )


def loss_rollout(ro: rollout.Rollout, lengths, mask_prefix: bool) -> rollout.Rollout:
  """The rollout the update reads: unchanged (the prefix is already out of ``completion_mask``),
  or with ``mask_prefix=False`` the prefix's tokens added to the loss mask."""
  if mask_prefix:
    return ro
  positions = np.arange(ro.completion_mask.shape[1])[None, :]
  prefix = (positions < np.asarray(lengths)[:, None]).astype(np.float32)
  mask = jnp.maximum(ro.completion_mask, prefix)  # on device, in the rollout's layout
  return ro.replace(completion_mask=mask, lengths=jnp.sum(mask, axis=1).astype(jnp.int32))


def row_metrics(rewards, lengths, real) -> dict[str, float]:
  """``denoise/recovery`` (mean reward of the rows with a prefix) and ``denoise/clean_reward``
  (of the others), over the real rows."""
  rewards, noisy, real = np.asarray(rewards), np.asarray(lengths) > 0, np.asarray(real) > 0
  out = {}
  if (noisy & real).any():
    out["denoise/recovery"] = float(rewards[noisy & real].mean())
  if (~noisy & real).any():
    out["denoise/clean_reward"] = float(rewards[~noisy & real].mean())
  return out


def recovery_evaluator(ctx):
  """``evaluate(params) -> recovery rate`` of the eval stage (None without DenoiseRL): greedy
  continuations of the first ``eval.pass_problems`` held-out problems after ``eval_rho`` of a
  wrong weak trace (the same prefixes for every parameters and arm: the eval key)."""
  if not ctx.config.rl.denoise.enabled:
    return None
  weak = build(ctx)
  greedy = samplers.make_sampler(
    ctx,
    ctx.sampler_config(temperature=0.0, max_new_tokens=ctx.config.rl.max_new_tokens),
    inserting=True,
  )
  problems = ctx.eval_problems[: ctx.config.eval.pass_problems]
  rho = float(ctx.config.rl.denoise.eval_rho)
  return lambda params: recovery_eval(ctx, weak, greedy, params, problems, ctx.eval_key, rho)[
    "recovery"
  ]


def recovery_eval(ctx, weak: Weak, sampler, params, problems, key, rho: float) -> dict:
  """Recovery from held-out wrong prefixes: greedy continuations (``sampler``) of ``problems``
  after the first ``rho`` of a wrong weak trace, scored on the continuation. Returns
  ``{"recovery": rate, "recovery_n": problems with a wrong trace}``."""
  d = ctx.config.rl.denoise
  traces = wrong_traces(
    ctx, weak, ctx.env, problems, jax.random.fold_in(key, streams.tag("denoise_weak")), int(d.tries)
  )
  kept = [(p, cut_prefix(t, rho, d.boundary)) for p, t in zip(problems, traces) if t]
  kept = [(p, c) for p, c in kept if c]
  if not kept:
    return {"recovery": float("nan"), "recovery_n": 0.0}
  Q = int(ctx.config.rl.max_new_tokens)
  rows = [p for p, _ in kept]
  enc = [ctx.tokenizer(c, add_special_tokens=False)["input_ids"][: Q - 1] for _, c in kept]
  ids = np.zeros((len(rows), Q), np.int32)
  lengths = np.asarray([len(e) for e in enc], np.int32)
  for i, e in enumerate(enc):
    ids[i, : len(e)] = e
  tokens, mask = rollout.encode_prompts(
    ctx.tokenizer, ctx.prompt_texts(rows), length=ctx.prompt_len
  )
  ro = sampler(params, tokens, mask, key, prefix=(ids, lengths))
  comp = rollout.continuation_only(
    parallel.to_host(ro.completion), lengths, ctx.tokenizer.pad_token_id
  )
  texts = rollout.decode_completions(ctx.tokenizer, comp)
  scores, _ = ctx.scorer.score(ctx.env, rows, texts, env=ctx.config.env.name)
  return {"recovery": float(np.mean(scores)), "recovery_n": float(len(rows))}
