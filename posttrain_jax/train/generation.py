"""One RL step's rollouts: prompts -> rollouts -> rewards (:func:`generate`); DESIGN.md section
3, steps 1-4. ``train/rl_step.py`` turns them into the update's rows.

``generate`` asks the run's :class:`~posttrain_jax.train.prompts.PromptSource` for candidates,
lets the prompt scheduler lay out the rows, samples from the sampler's weight copy and scores
on the host. With DAPO dynamic sampling (``config.rl.dynamic_sampling``) it repeats that draw,
at the same static shape, until ``P`` groups with a learning signal are found or ``max_rounds``
rounds ran, then assembles the batch from the kept groups (signal groups first in draw order,
the shortfall filled with zero-signal groups, which get zero advantage), so the update's row
count never changes. Every generated rollout is counted (``rollouts/generated``), so arms can
be compared at equal rollouts. Failed reward calls (``rewards/``: raised, timed out, NaN/inf,
not a number) score 0 and are counted per kind over all draw rounds in ``reward/errors/<kind>``
(counts of calls); above ``config.reward.max_error_rate`` of them the run stops.
"""

from typing import NamedTuple

import jax
import numpy as np

from posttrain_jax import parallel, rollout, scheduling, streams
from posttrain_jax.envs import dynamic_sampling
from posttrain_jax.rewards import outcomes
from posttrain_jax.train import hooks, samplers
from posttrain_jax.train import prompts as prompts_lib


def score_texts(ctx, verifier, problems, texts, terms_out=None) -> tuple[np.ndarray, np.ndarray]:
  """``(rewards [B] float32, failure codes [B] float32)`` of ``verifier.verify`` on each
  (problem, text), by the run's :class:`~posttrain_jax.rewards.Scorer` (worker processes, a
  timeout per call); a failed call scores 0 and gets its kind's code
  (``rewards.outcomes.CODES``; 0: a reward), and the first of each kind is printed once.
  With ``config.reward.terms`` the reward is the run's weighted sum of terms
  (``ctx.reward_terms``, rewards/terms.py), and ``(components, errors)`` of the batch are
  appended to ``terms_out`` (a list) for the step's ``reward/<term>`` metrics."""
  if ctx.reward_terms is None:
    rewards, codes = ctx.scorer.score(verifier, problems, texts, env=env_label(ctx))
  else:
    rewards, codes, comps, errs = ctx.reward_terms.score(
      ctx.scorer, verifier, problems, texts, env=env_label(ctx)
    )
    if terms_out is not None:
      terms_out.append((comps, errs))
  return rewards, codes.astype(np.float32)


def term_metrics(ctx, terms) -> dict[str, float]:
  """``reward/<term>`` and ``reward/<term>/errors`` over the real rows of every draw round
  (``terms``: ``(components, errors, real)`` per round)."""

  def gather(part, dtype):  # a key missing from a round (a term's sub-key) counts as zeros
    keys = dict.fromkeys(k for t in terms for k in t[part])
    return {
      k: np.concatenate([t[part].get(k, np.zeros(len(t[2]), dtype)) for t in terms]) for k in keys
    }

  comps, errs = gather(0, np.float32), gather(1, bool)
  return ctx.reward_terms.metrics(comps, errs, np.concatenate([m for _, _, m in terms]))


def env_label(ctx) -> str:
  """What the run's reward messages call its verifier: the dataset or the env."""
  return ctx.config.env.dataset or ctx.config.env.name


def zero_signal_fraction(rewards, group, valid, *, per_rollout: bool = False) -> float:
  """Fraction of the step's groups (with at least one real row) whose real rows all got the
  same reward: zero group-relative advantage, no policy gradient (host arrays). With
  ``per_rollout`` the fraction of real rollouts in such groups (fair to variable group sizes:
  a small group is all-equal more often)."""
  real = np.asarray(valid) > 0
  group, rewards = np.asarray(group)[real], np.asarray(rewards)[real]
  ids = np.unique(group)
  if not len(ids):
    return 0.0
  flat = np.asarray([np.ptp(rewards[group == g]) == 0 for g in ids])
  if per_rollout:
    sizes = np.asarray([np.sum(group == g) for g in ids])
    return float(np.sum(sizes * flat) / np.sum(sizes))
  return float(np.mean(flat))


class Generated(NamedTuple):
  """What :func:`generate` returns: the row layout (``sel.problems``, ``sel.group``,
  ``sel.valid``), the rollouts, global ``[R]`` rewards and verifier-error flags, the weight
  version that sampled them and host metrics of the draw."""

  sel: scheduling.Selection
  ro: rollout.Rollout
  rewards: jax.Array
  errors: jax.Array
  version: int
  metrics: dict


def local_problems(ctx, problems, rows: int, index=None):
  """This process's ``(lo, hi)`` of ``rows`` and the problems of those rows, encoded as a
  global ``(tokens, mask)`` batch (each process encodes only its own rows)."""
  lo, hi = ctx.placement.local_rows(rows)
  index = np.arange(rows) if index is None else index
  local = [problems[i] for i in index[lo:hi]]
  tokens, mask = rollout.encode_prompts(
    ctx.tokenizer, ctx.prompt_texts(local), length=ctx.prompt_len
  )
  return local, ctx.placement.from_local((tokens, mask), rows)


def score(ctx, source, ro, local, rows: int, terms_out=None, prefix_lengths=None):
  """Global ``(rewards [rows], failure codes [rows])``: this process decodes and scores its
  rows with the verifier of ``source`` (a :class:`~posttrain_jax.train.prompts.PromptSource`);
  ``terms_out``: see :func:`score_texts` (this process's rows). ``prefix_lengths`` [rows]: each
  row's given prefix (a method's ``prefix`` hook), left out of the scored text: only the
  continuation counts."""
  completion = parallel.local_rows(ro.completion)
  if prefix_lengths is not None:
    completion = rollout.continuation_only(completion, prefix_lengths, ctx.tokenizer.pad_token_id)
  texts = rollout.decode_completions(ctx.tokenizer, completion)
  return ctx.placement.from_local(score_texts(ctx, source.verifier, local, texts, terms_out), rows)


def behaviour_weights(run_state: dict) -> tuple:
  """``(params, version)`` the sampler reads: ``staleness`` steps behind the trainer's, or its
  current ones; the version is the trainer's step that produced them."""
  if run_state["history"]:
    return run_state["history"][0], run_state["history_versions"][0]
  return run_state["policy"].params, int(run_state["policy"].step)


def _draw(ctx, run, weights, version, key, step: int, terms_out=None, route_shift=None):
  """One draw round: candidates -> scheduler layout -> rollouts -> rewards."""
  P, R = ctx.config.rl.prompts_per_step, run.layout.gen_rows
  candidates = run.host.prompts.candidates(jax.random.fold_in(key, streams.tag("candidates")), P)
  sel = run.host.scheduler.select(step, candidates, jax.random.fold_in(key, streams.tag("select")))
  if sel.rows != R:
    raise ValueError(
      f"scheduler {run.layout.scheduler_name!r} laid out {sel.rows} rows, the run was built for {R}"
    )
  local, (tokens, mask) = local_problems(ctx, sel.problems, R, sel.group)
  given = _prefix(ctx, run, sel, key)
  prefix = None if given is None else (given.ids, given.lengths)
  lengths = None if given is None else given.lengths
  extra = {} if given is None else dict(given.metrics)
  ro = samplers.sample(
    run.fns.sample,
    weights,
    tokens,
    mask,
    jax.random.fold_in(key, streams.tag("sample")),
    version,
    problems=local,
    prefix=prefix,
    route_shift=route_shift,
  )
  ro = ctx.placement.rows_here(ro, R)  # from config.sampler_mesh, if set (else a no-op)
  ro = ro.replace(group=ctx.placement.put_rows(sel.group, R))
  rewards, errors = score(ctx, run.host.prompts, ro, local, R, terms_out, lengths)
  if given is not None and given.finish is not None:
    ro, finish_metrics = given.finish(ro, rewards, sel.valid)
    extra.update(finish_metrics)
  if terms_out:  # this process's real rows of the round
    lo, hi = ctx.placement.local_rows(R)
    terms_out[-1] = terms_out[-1] + (sel.valid[lo:hi] > 0,)
  return sel, ro, rewards, errors, extra


def _prefix(ctx, run, sel, key):
  """The round's :class:`~posttrain_jax.train.hooks.Prefix` from the active method with a
  ``prefix`` hook (at most one: checked when the run is built), or None."""
  for m in hooks.with_hook(ctx.methods, ctx.config, "prefix"):
    return m.prefix(ctx, run, run.methods[m.name], sel, run.host.prompts.verifier, key)
  return None


def generate(ctx, run, params, version: int, key, step: int = 0, route_shift=None) -> Generated:
  """Prompts (the source's candidates, the scheduler's selection) -> rollouts (sampled from
  the weight copy of ``params``, tagged ``version``, routed with ``route_shift`` when given:
  an active method's ``route_shift`` hook) -> texts -> rewards, with dynamic sampling's extra
  rounds if enabled. ``behaviour_weights(run_state)`` gives the synchronous loop's
  ``(params, version)``."""
  weights = run.host.weights(run.fns.full(params), version)
  rounds, metrics, signal, failures = [], outcomes.counts([]), 0, []
  max_rounds = max(run.layout.dynamic_rounds, 1)
  P = ctx.config.rl.prompts_per_step
  terms, agent_rounds = [], []
  for r in range(max_rounds):
    sel, ro, rewards, errors, extra = _draw(
      ctx, run, weights, version, prompts_lib.round_key(key, r), step, terms, route_shift
    )
    host_rewards, host_codes = parallel.to_host((rewards, errors))
    real = sel.valid > 0
    failures.append(host_codes[real])
    for k, v in outcomes.counts(host_codes, real).items():
      metrics[k] += v
    metrics.update(
      run.host.prompts.observe(
        prompts_lib.row_problems(sel.problems, sel.group[real]), host_rewards[real]
      )
    )
    if ro.env_mask is not None:  # tool calls, errors and observation tokens; a prefix's
      turns = getattr(run.fns.sample, "turns", None)  # a method's episodes (tool use)
      agent_rounds.append(
        {**(turns.metrics(parallel.to_host(ro), real) if turns is not None else {}), **extra}
      )
    rounds.append((sel, ro, rewards, errors, host_rewards))
    metrics["rollouts/generated"] = metrics.get("rollouts/generated", 0.0) + float(real.sum())
    if not run.layout.dynamic_rounds:
      break
    signal += int((~_flat_groups(sel, host_rewards)).sum())
    if signal >= P:
      break
  ctx.scorer.check(np.concatenate(failures), where=f"rl step {step + 1}", env=env_label(ctx))
  if terms:
    metrics.update(term_metrics(ctx, terms))
  for k in dict.fromkeys(k for m in agent_rounds for k in m):  # the mean over the draw rounds
    metrics[k] = float(np.mean([m[k] for m in agent_rounds if k in m]))
  if not run.layout.dynamic_rounds:
    return Generated(sel, ro, rewards, errors, version, metrics)
  return _assemble(ctx, run, rounds, version, metrics)


def _flat_groups(sel, host_rewards) -> np.ndarray:
  """[P] True for a prompt slot whose rows all got the same reward (no learning signal)."""
  return dynamic_sampling.zero_signal(
    [host_rewards[(sel.group == g) & (sel.valid > 0)] for g in range(len(sel.problems))]
  )


def _assemble(ctx, run, rounds, version, metrics) -> Generated:
  """The step's batch from the draw rounds: ``P`` groups with a signal in draw order, the
  shortfall filled with zero-signal groups (zero advantage), rows regrouped ``0..P-1``."""
  P, R = ctx.config.rl.prompts_per_step, run.layout.gen_rows
  kept, flat, dropped_max, dropped_min = [], [], 0, 0
  for r, (sel, _, _, _, host_rewards) in enumerate(rounds):
    for g, dead in enumerate(_flat_groups(sel, host_rewards)):
      (flat if dead else kept).append((r, g))
      if dead:
        first = host_rewards[np.flatnonzero(sel.group == g)[0]]
        dropped_max += first >= 1.0
        dropped_min += first <= 0.0
  chosen = (kept + flat)[:P]
  host = [
    (scheduling.rows_from_rollout(parallel.to_host(ro), rewards=h, errors=parallel.to_host(e)), sel)
    for sel, ro, _, e, h in rounds
  ]
  index = [np.flatnonzero(host[r][1].group == g) for r, g in chosen]
  rows = {
    k: np.concatenate([host[r][0][k][i] for (r, _), i in zip(chosen, index)]) for k in host[0][0]
  }
  problems = [host[r][1].problems[g] for r, g in chosen]
  sel = scheduling.uniform_selection(
    problems, run.host.scheduler.group_size, metrics=rounds[0][0].metrics
  )
  rows["group"] = sel.group
  put = lambda x: ctx.placement.put_rows(x, R)
  ro = scheduling.rollout_from_rows(
    {k: put(v) for k, v in rows.items() if k not in ("rewards", "errors")}
  )
  metrics.update(
    {
      "dynamic/rounds": float(len(rounds)),
      "dynamic/kept": float(min(len(kept), P)),
      "dynamic/short": float(max(P - len(kept), 0)),
      "dynamic/keep_rate": len(kept) / (len(rounds) * P),
      "dynamic/dropped_all_max": float(dropped_max),
      "dynamic/dropped_all_min": float(dropped_min),
    }
  )
  return Generated(sel, ro, put(rows["rewards"]), put(rows["errors"]), version, metrics)
