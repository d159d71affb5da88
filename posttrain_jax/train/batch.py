"""One RL step's data: prompts -> rollouts -> rewards (:func:`generate`), then advantages,
log-probs and IS weights for the update (:func:`train_batch`); DESIGN.md section 3, steps 1-6.

``generate`` asks the run's :class:`~posttrain_jax.train.prompts.PromptSource` for candidates,
lets the prompt scheduler lay out the rows, samples from the sampler's weight copy and scores
on the host. With DAPO dynamic sampling (``config.rl.dynamic_sampling``) it repeats that draw,
at the same static shape, until ``P`` groups with a learning signal are found or ``max_rounds``
rounds ran, then assembles the batch from the kept groups (signal groups first in draw order,
the shortfall filled with zero-signal groups, which get zero advantage), so the update's row
count never changes. Every generated rollout is counted (``rollouts/generated``), so arms can
be compared at equal rollouts.

``train_batch`` first cuts the completion axis to the batch's width
(``config.rl.trim_completions``: the longest completion rounded up to a power of two, see
:func:`rollout.trimmed_length`), so a run whose answers end well inside the ``max_new_tokens``
budget does not run its trainer forwards and update over the padding; each width is one more
compiled program (a handful per run).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from posttrain_jax import objectives
from posttrain_jax import parallel
from posttrain_jax import rollout
from posttrain_jax import scheduling
from posttrain_jax.envs import dynamic_sampling
from posttrain_jax.train import prompts as prompts_lib
from posttrain_jax.train import scheduler as scheduler_lib

# Advantages that read the frozen teacher's log-probs (on-policy distillation from the RL start,
# i.e. self-distillation towards the reference) and those that need a greedy-rollout baseline.
TEACHER_ADVANTAGES = ("opd", "gndpo")
GREEDY_BASELINE_ADVANTAGES = ("remax",)
_trim = jax.jit(rollout.trim_completions, static_argnums=1)


def score_rows(env, problems, texts) -> tuple[np.ndarray, np.ndarray]:
  """Rewards [B] float32 from ``env.verify`` and [B] float32 flags of verifiers that raised
  (those score 0)."""
  rewards, errors = np.zeros(len(texts), np.float32), np.zeros(len(texts), np.float32)
  for i, (p, t) in enumerate(zip(problems, texts)):
    try:
      rewards[i] = float(env.verify(p, t))
    except Exception:  # a broken reward must not kill a long run; it is counted and logged
      errors[i] = 1.0
  return rewards, errors


def score_completions(env, problems, texts) -> tuple[np.ndarray, int]:
  """Rewards [B] float32 from ``env.verify``; a verifier that raises scores 0 and is counted."""
  rewards, errors = score_rows(env, problems, texts)
  return rewards, int(errors.sum())


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
  tokens, mask = rollout.encode_prompts(ctx.tokenizer, ctx.prompt_texts(local),
                                        length=ctx.prompt_len)
  return local, ctx.placement.from_local((tokens, mask), rows)


def score(ctx, verifier, ro, local, rows: int):
  """Global ``(rewards [rows], error flags [rows])``: this process decodes and scores its rows."""
  texts = rollout.decode_completions(ctx.tokenizer, parallel.local_rows(ro.completion))
  return ctx.placement.from_local(score_rows(verifier, local, texts), rows)


def greedy_baseline(ctx, pieces, params, problems, key) -> jax.Array:
  """[P] rewards of one greedy rollout per prompt (ReMax's baseline)."""
  local, (tokens, mask) = local_problems(ctx, problems, len(problems))
  ro = pieces.greedy(params, tokens, mask, key)
  return score(ctx, pieces.prompts, ro, local, len(problems))[0]


def behaviour_weights(run_state: dict) -> tuple:
  """``(params, version)`` the sampler reads: ``staleness`` steps behind the trainer's, or its
  current ones; the version is the trainer's step that produced them."""
  if run_state["history"]:
    return run_state["history"][0], run_state["history_versions"][0]
  return run_state["policy"].params, int(run_state["policy"].step)


def _draw(ctx, pieces, weights, version, key, step: int):
  """One draw round: candidates -> scheduler layout -> rollouts -> rewards."""
  P, R = ctx.config.rl.prompts_per_step, pieces.gen_rows
  candidates = pieces.prompts.candidates(jax.random.fold_in(key, 0), P)
  sel = pieces.scheduler.select(step, candidates, jax.random.fold_in(key, 5))
  if sel.rows != R:
    raise ValueError(f"scheduler {pieces.scheduler_name!r} laid out {sel.rows} rows, the run "
                     f"was built for {R}")
  local, (tokens, mask) = local_problems(ctx, sel.problems, R, sel.group)
  ro = pieces.sample(weights, tokens, mask, jax.random.fold_in(key, 1), version)
  ro = ctx.placement.rows_here(ro, R)  # from config.sampler_mesh, if set (else a no-op)
  ro = ro.replace(group=ctx.placement.put_rows(sel.group, R))
  rewards, errors = score(ctx, pieces.prompts, ro, local, R)
  return sel, ro, rewards, errors


def generate(ctx, pieces, params, version: int, key, step: int = 0) -> Generated:
  """Prompts (the source's candidates, the scheduler's selection) -> rollouts (sampled from
  the weight copy of ``params``, tagged ``version``) -> texts -> rewards, with dynamic
  sampling's extra rounds if enabled. ``behaviour_weights(run_state)`` gives the synchronous
  loop's ``(params, version)``."""
  weights = pieces.weights(pieces.full(params), version)
  rounds, metrics, signal = [], {}, 0
  max_rounds = max(pieces.dynamic_rounds, 1)
  P = ctx.config.rl.prompts_per_step
  for r in range(max_rounds):
    sel, ro, rewards, errors = _draw(ctx, pieces, weights, version,
                                     prompts_lib.round_key(key, r), step)
    host_rewards = parallel.to_host(rewards)
    real = sel.valid > 0
    metrics.update(pieces.prompts.observe(
        prompts_lib.row_problems(sel.problems, sel.group[real]), host_rewards[real]))
    rounds.append((sel, ro, rewards, errors, host_rewards))
    metrics["rollouts/generated"] = metrics.get("rollouts/generated", 0.0) + float(real.sum())
    if not pieces.dynamic_rounds:
      break
    signal += int((~_flat_groups(sel, host_rewards)).sum())
    if signal >= P:
      break
  if not pieces.dynamic_rounds:
    return Generated(sel, ro, rewards, errors, version, metrics)
  return _assemble(ctx, pieces, rounds, version, metrics)


def _flat_groups(sel, host_rewards) -> np.ndarray:
  """[P] True for a prompt slot whose rows all got the same reward (no learning signal)."""
  return dynamic_sampling.zero_signal(
      [host_rewards[(sel.group == g) & (sel.valid > 0)] for g in range(len(sel.problems))])


def _assemble(ctx, pieces, rounds, version, metrics) -> Generated:
  """The step's batch from the draw rounds: ``P`` groups with a signal in draw order, the
  shortfall filled with zero-signal groups (zero advantage), rows regrouped ``0..P-1``."""
  P, R = ctx.config.rl.prompts_per_step, pieces.gen_rows
  kept, flat, dropped_max, dropped_min = [], [], 0, 0
  for r, (sel, _, _, _, host_rewards) in enumerate(rounds):
    for g, dead in enumerate(_flat_groups(sel, host_rewards)):
      (flat if dead else kept).append((r, g))
      if dead:
        first = host_rewards[np.flatnonzero(sel.group == g)[0]]
        dropped_max += first >= 1.0
        dropped_min += first <= 0.0
  chosen = (kept + flat)[:P]
  host = [(scheduling.rows_from_rollout(parallel.to_host(ro), rewards=h,
                                        errors=parallel.to_host(e)), sel)
          for sel, ro, _, e, h in rounds]
  index = [np.flatnonzero(host[r][1].group == g) for r, g in chosen]
  rows = {k: np.concatenate([host[r][0][k][i] for (r, _), i in zip(chosen, index)])
          for k in host[0][0]}
  problems = [host[r][1].problems[g] for r, g in chosen]
  sel = scheduling.uniform_selection(problems, pieces.scheduler.group_size,
                                     metrics=rounds[0][0].metrics)
  rows["group"] = sel.group
  put = lambda x: ctx.placement.put_rows(x, R)
  ro = scheduling.rollout_from_rows({k: put(v) for k, v in rows.items()
                                     if k not in ("rewards", "errors")})
  metrics.update({
      "dynamic/rounds": float(len(rounds)), "dynamic/kept": float(min(len(kept), P)),
      "dynamic/short": float(max(P - len(kept), 0)),
      "dynamic/keep_rate": len(kept) / (len(rounds) * P),
      "dynamic/dropped_all_max": float(dropped_max), "dynamic/dropped_all_min": float(dropped_min)})
  return Generated(sel, ro, put(rows["rewards"]), put(rows["errors"]), version, metrics)


def train_batch(ctx, pieces, run_state, ref_params, gen: Generated, key, step: int = 0):
  """Advantages, reference/trainer log-probs and IS weights for the update. Returns (batch, m)."""
  cfg = ctx.config.rl
  sel, ro, rewards, errors = gen.sel, gen.ro, gen.rewards, gen.errors
  problems, R = sel.problems, pieces.gen_rows
  record = dict(gen.metrics)
  if pieces.trim_min:  # train on the batch's completion width, not the budget
    width = rollout.trimmed_length(parallel.to_host(ro.completion_mask), pieces.trim_min)
    if width < ro.completion_mask.shape[1]:
      ro = _trim(ro, width)
    record["batch/width"] = float(width)
  params = pieces.full(run_state["policy"].params)
  routes = ro.routes if pieces.routing_replay else None
  trainer = (pieces.trainer_logprobs(params, ro.tokens, ro.start, routes)
              if pieces.need_trainer else None)  # else: mismatch metrics come from the update
  batch = {}
  if routes is not None:
    batch["routes"] = routes
    record["moe/routing_overlap"] = pieces.routing_overlap(params, ro.tokens, ro.start, routes,
                                                           ro.completion_mask)
  ref = jnp.zeros_like(ro.logprobs)
  if pieces.ref_logprobs is not None:
    out = pieces.ref_logprobs(ref_params, ro.tokens, ro.start, routes)
    ref, batch["ref_logits"] = out if isinstance(out, tuple) else (out, None)
    if batch["ref_logits"] is None:
      del batch["ref_logits"]
  shaped = rewards
  if cfg.kl_coef and cfg.kl_in_reward:  # KL in the reward: r - β Σ_t k(π, π_ref)
    kl_fn = objectives.lookup(objectives.KL_ESTIMATORS, cfg.kl_estimator, "KL estimator")
    seq_kl = objectives.masked_sum(kl_fn(trainer, ref), ro.completion_mask, axis=1)
    shaped = shaped - run_state["controls"]["kl_coef"] * seq_kl
    record["kl/ref"] = jnp.mean(seq_kl / jnp.maximum(ro.lengths, 1))
  baseline = None
  if pieces.greedy is not None:
    baseline = greedy_baseline(ctx, pieces, params, problems,
                               jax.random.fold_in(key, 3))[ro.group]
  valid = ctx.placement.put_rows(sel.valid, R)
  # Padding rows (valid 0, e.g. CERO's padded layout) contribute nothing to the loss.
  mask = ro.completion_mask * valid[:, None]
  values = None
  if pieces.values is not None:
    values = pieces.values(run_state["critic"].params, ro.tokens, ro.start)
    batch["critic"] = {"tokens": ro.tokens, "start": ro.start, "mask": mask,
                       "old_values": values,
                       "returns": pieces.returns(shaped, values, mask)}
  adv, adv_metrics = pieces.advantages(objectives.AdvantageInputs(
      rewards=shaped, group=ro.group, valid=valid, mask=mask,
      logprobs=ro.logprobs,
      teacher_logprobs=ref if cfg.advantage in TEACHER_ADVANTAGES else None,
      values=values, baseline_rewards=baseline))
  if trainer is None:
    weights, is_metrics = mask, {}
  else:
    weights, is_metrics = pieces.is_weights(trainer, ro.logprobs, mask)
    is_metrics = {**is_metrics, **pieces.mismatch(trainer, ro.logprobs, mask)}
  old = ro.logprobs if cfg.old_logprobs == "behaviour" else trainer
  batch.update({"tokens": ro.tokens, "start": ro.start, "mask": mask,
                "old_logprobs": old, "behaviour_logprobs": ro.logprobs, "is_weights": weights,
                "advantages": adv, "ref_logprobs": ref, "rewards": rewards,
                "group": ro.group, "valid": valid})
  record.update({**adv_metrics, **is_metrics})
  host_rewards, host_errors, lengths, truncated = parallel.to_host(
      (rewards, errors, ro.lengths, ro.truncated))
  real = sel.valid > 0  # statistics over real rows only (all rows without padding)
  record.update({
      "batch/zero_signal_groups": zero_signal_fraction(host_rewards, sel.group, sel.valid),
      "batch/zero_signal_rollouts": zero_signal_fraction(host_rewards, sel.group, sel.valid,
                                                         per_rollout=True),
      "reward/mean": float(host_rewards[real].mean()),
      "reward/std": float(host_rewards[real].std()),
      "reward/errors": float(host_errors[real].sum()),
      "gen/len_mean": float(lengths[real].mean()), "gen/truncated": float(truncated[real].mean()),
  })
  if pieces.scheduler_name != scheduler_lib.NONE:
    record.update(_schedule(ctx, pieces, params, ref_params, ro, batch, adv, host_rewards,
                            sel, step, key))
  return batch, record


def _schedule(ctx, pieces, params, ref_params, ro, batch, adv, host_rewards, sel, step,
              key) -> dict:
  """The scheduler's part after scoring: ``compose`` appends the ``M`` replayed rows to
  ``batch`` (in place; their stored behaviour log-probs and advantages, the trainer's and
  reference log-probs recomputed), then ``observe``. Returns its metrics."""
  sched = pieces.scheduler
  host_adv = parallel.to_host(adv)
  record = {k: float(v) for k, v in sel.metrics.items()}
  if pieces.replay_rows:
    host = parallel.to_host(ro)
    rows = scheduling.rows_from_rollout(host, advantages=host_adv, rewards=host_rewards,
                                        valid=sel.valid)
    out = sched.compose(step, rows, jax.random.fold_in(key, 6), uids=sel.row_uids())
    rep = {k: v[pieces.gen_rows:] for k, v in out.rows.items()}
    record.update(out.metrics)
    batch.update(_replay_batch(ctx, pieces, params, ref_params, rep, batch))
  record.update(sched.observe(step, sel.problems, host_rewards, sel.group, sel.valid,
                              advantages=host_adv))
  events = getattr(sched, "last_events", None)  # review: visit events (repair-window input)
  if events and pieces.event_log is not None:
    for event in events:
      pieces.event_log.write(event["step"], {k: v for k, v in event.items() if k != "step"})
  return record


def _replay_batch(ctx, pieces, params, ref_params, rep, batch) -> dict:
  """``batch`` with the replayed rows ``rep`` (host, ``M`` rows) appended to every field."""
  cfg, M = ctx.config.rl, pieces.replay_rows
  put = lambda x: ctx.placement.put_rows(x, M)
  ro = scheduling.rollout_from_rows({k: put(v) for k, v in rep.items()
                                     if k not in ("advantages", "rewards", "valid", "is_replay",
                                                  "age")})
  valid = put(rep["valid"].astype(np.float32))
  mask = ro.completion_mask * valid[:, None]
  routes = ro.routes if pieces.routing_replay else None
  trainer = (pieces.trainer_logprobs(params, ro.tokens, ro.start, routes)
              if pieces.need_trainer else None)
  extra = {}
  if routes is not None:
    extra["routes"] = routes
  ref = jnp.zeros_like(ro.logprobs)
  if pieces.ref_logprobs is not None:
    out = pieces.ref_logprobs(ref_params, ro.tokens, ro.start, routes)
    ref, logits = out if isinstance(out, tuple) else (out, None)
    if logits is not None:
      extra["ref_logits"] = logits
  weights = mask if trainer is None else pieces.is_weights(trainer, ro.logprobs, mask)[0]
  old = ro.logprobs if cfg.old_logprobs == "behaviour" else trainer
  extra.update({"tokens": ro.tokens, "start": ro.start, "mask": mask, "old_logprobs": old,
                "behaviour_logprobs": ro.logprobs, "is_weights": weights,
                "advantages": put(rep["advantages"]), "ref_logprobs": ref,
                "rewards": put(rep["rewards"]), "group": ro.group, "valid": valid})
  fresh = {k: batch[k] for k in extra}
  return pieces.concat_rows(fresh, extra)


def _update_controls(cfg, controls: dict, metrics: dict) -> dict:
  """Pure controller updates from this step's metrics (DCMDP λ, adaptive KL β)."""
