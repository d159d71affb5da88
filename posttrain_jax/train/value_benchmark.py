"""SVEB on a policy (``config.eval.sveb_prompts`` > 0; analysis/value_benchmark.py for the
scores): Monte-Carlo values of partial responses, and how well the leave-one-out estimators the
library trains with predict them.

1. ``G`` responses to each of the first ``P`` evaluation problems, sampled at the RL
   temperature, and their rewards.
2. ``cuts`` states per response, ``s = (x, y_<t)`` at distinct cut points ``1 <= t < len``
   drawn with the evaluation seed.
3. ``V*(s)``: the mean reward of ``M`` continuations of the prefix, sampled by the same policy
   with the library's sampler (prompt text + prefix text as the prompt) and scored as
   ``prefix + continuation``.
4. Each estimator's value of the same states, computed from the ``G`` responses as in RL:
   ``group_mean`` (leave-one-out mean reward of the prompt's other responses, the GRPO / RLOO
   baseline), ``numca`` (the numbers completed before ``t``) and ``hista`` (the last-layer
   hidden state before ``t``, ``tau = 0.1``) from objectives/state_values.py.

Returns ``{f"sveb_{score}_{estimator}": value}`` with score in mse / spearman / collapse,
``sveb_mse_below_group_mean_{numca,hista,...}`` (every estimator but the group mean's) (the group mean's MSE minus the estimator's, on the
same states), ``sveb_states`` and ``sveb_truth_mean``.
"""

import jax
import jax.numpy as jnp
import numpy as np

from posttrain_jax import objectives, rollout
from posttrain_jax.analysis import value_benchmark
from posttrain_jax.train import inputs, samplers, updates

ESTIMATORS = ("group_mean", "numca", "hista")


def _rewards(ctx, problems, texts) -> np.ndarray:
  return np.asarray(ctx.scorer.score(ctx.env, problems, texts, env=ctx.config.env.name)[0])


def mc_states(ctx, params, *, prompts: int, group: int, cuts: int, continuations: int) -> dict:
  """Steps 1-3 of the module docstring: ``rows`` (problems, one per response), ``prompt_texts``,
  ``completion`` [N, T] ids, ``lengths`` [N] (tokens before EOS), ``rewards`` [N], ``states``
  [K, 2] (response, cut t) and ``truth`` [K] (``V*``)."""
  cfg = ctx.config.rl
  problems = ctx.eval_problems[:prompts]
  rows = [p for p in problems for _ in range(group)]
  S, T = ctx.prompt_len, cfg.max_new_tokens
  key = jax.random.fold_in(ctx.eval_key, 7919)
  sampler = samplers.make_sampler(
    ctx, ctx.sampler_config(temperature=cfg.temperature, max_new_tokens=T), inserting=False
  )
  prompt_texts = ctx.prompt_texts(rows)
  completion, texts = samplers.sample_texts(
    ctx, sampler, params, prompt_texts, S, key, min(len(rows), 256)
  )
  rewards = _rewards(ctx, rows, texts)
  eos = ctx.tokenizer.eos_token_id
  lengths = np.array([int(np.sum(np.cumsum(c == eos) == 0)) for c in completion])
  rng = np.random.default_rng(int(jax.random.randint(key, (), 0, 2**31 - 1)))
  states = []  # (row, t)
  for b, n in enumerate(lengths):
    if n >= 2:
      for t in np.sort(rng.choice(np.arange(1, n), size=min(cuts, n - 1), replace=False)):
        states.append((b, int(t)))
  if not states:
    raise ValueError("SVEB: no sampled response has two tokens to cut between")
  prefixes = [
    rollout.decode_completions(ctx.tokenizer, completion[b : b + 1, :t])[0] for b, t in states
  ]
  M = continuations
  cont_prompts = [prompt_texts[b] + p for (b, _), p in zip(states, prefixes) for _ in range(M)]
  _, cont_texts = samplers.sample_texts(
    ctx,
    sampler,
    params,
    cont_prompts,
    S + T,
    jax.random.fold_in(key, 1),
    min(len(cont_prompts), 256),
  )
  cont_rows = [rows[b] for b, _ in states for _ in range(M)]
  full = [p + c for p, c in zip([p for p in prefixes for _ in range(M)], cont_texts)]
  truth = _rewards(ctx, cont_rows, full).reshape(len(states), M).mean(axis=1)
  return dict(
    rows=rows,
    prompt_texts=prompt_texts,
    completion=completion,
    lengths=lengths,
    rewards=rewards,
    states=np.asarray(states, np.int64),
    truth=truth,
  )


def benchmark(
  ctx, params, *, prompts: int, group: int, cuts: int, continuations: int, extra=None
) -> dict:
  """SVEB of ``params`` (module docstring). ``extra``: ``{name: values(tokens [B, S+T],
  start [B]) -> [B, T]}``, more estimators scored on the same states (a method's
  ``state_values``: the PPO critic)."""
  mc = mc_states(ctx, params, prompts=prompts, group=group, cuts=cuts, continuations=continuations)
  rows, completion, lengths, rewards = mc["rows"], mc["completion"], mc["lengths"], mc["rewards"]
  states, truth = mc["states"], mc["truth"]
  S, T = ctx.prompt_len, ctx.config.rl.max_new_tokens
  problems = ctx.eval_problems[:prompts]
  prompt_texts = mc["prompt_texts"]
  # The estimators, from the G responses as an RL step computes them.
  group_ids = jnp.repeat(jnp.arange(len(problems), dtype=jnp.int32), group)
  valid = jnp.ones(len(rows), jnp.float32)
  mask = jnp.asarray((np.arange(T)[None] < lengths[:, None]).astype(np.float32))
  r = jnp.asarray(rewards, jnp.float32)
  keys = jnp.asarray(inputs.completion_milestones(ctx.tokenizer, completion, lengths))
  tokens, pmask = rollout.encode_prompts(ctx.tokenizer, prompt_texts, length=S)
  full_tokens = jnp.concatenate([jnp.asarray(tokens), jnp.asarray(completion, jnp.int32)], axis=1)
  start = jnp.asarray(S - pmask.sum(axis=1), jnp.int32)
  hidden = updates.make_hidden_fn(ctx.graphdef, S)(params, full_tokens, start)
  loo = np.asarray(objectives.loo_group_mean(r, group_ids, valid))
  tables = {
    "group_mean": np.broadcast_to(loo[:, None], (len(rows), T)),
    "numca": np.asarray(objectives.numca_values(r, group_ids, valid, keys, mask)),
    "hista": np.asarray(objectives.hista_values(r, group_ids, valid, hidden, mask)),
  }
  for name, values in (extra or {}).items():
    if name in tables:
      raise ValueError(f"SVEB: an extra estimator may not be named {name!r} (a built-in one)")
    tables[name] = np.asarray(jax.device_get(values(full_tokens, start)), np.float64)
  b_idx, t_idx = states[:, 0], states[:, 1]
  prompt_of = np.asarray(group_ids)[b_idx]
  out = {"sveb_states": float(len(states)), "sveb_truth_mean": float(truth.mean())}
  for name in tables:
    scores = value_benchmark.score(tables[name][b_idx, t_idx], truth, prompt_of)
    out.update({f"sveb_{k}_{name}": v for k, v in scores.items()})
  for name in list(tables)[1:]:  # paired on the same states: > 0 where it beats the group mean
    out[f"sveb_mse_below_group_mean_{name}"] = out["sveb_mse_group_mean"] - out[f"sveb_mse_{name}"]
  return out
