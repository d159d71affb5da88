"""One RL step, top to bottom (DESIGN.md section 3): prompts, sample, score, trim, side forwards,
advantages, replay, update, controllers.

:func:`rl_step` reads ``run`` (``train.rl.RLRun``: the compiled functions, the run's static
layout and its host-side state) and the device state ``state`` (the policy's train state,
the active methods' slots, controller values, the stale-parameter queue), and returns the new state and the
step's metrics. Every random draw comes from ``key`` (``fold_in(run_key, step)``).
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

from posttrain_jax import parallel, rollout, scheduling, streams
from posttrain_jax.train import context as context_lib
from posttrain_jax.train import controls as controls_lib
from posttrain_jax.train import generation, hooks
from posttrain_jax.train import inputs as inputs_lib

_trim = jax.jit(rollout.trim_completions, static_argnums=1)


def rl_step(
  ctx, run, state: dict, ref_params, key, step: int | None = None, producer=None
) -> tuple[dict, dict]:
  """One iteration. ``step`` (the scheduler's step) defaults to a count of ``run``'s calls;
  with a ``producer`` (asynchronous rollouts) the rollouts come from its queue and the updated
  parameters are published to it."""
  cfg = ctx.config.rl
  if step is None:
    step = run.host.next_step
  run.host.next_step = step + 1
  parallel.executables.prefetch()  # a rerun: load the stored update etc. while sampling
  t0 = time.perf_counter()
  # --- prompts, sample, score ------------------------------------------------------------------
  if producer is None:
    shift = hooks.route_shift(ctx, run, state)
    gen = generation.generate(
      ctx, run, *generation.behaviour_weights(state), key, step, route_shift=shift
    )
    record = {}
  else:
    gen, record = producer.get(int(state["policy"].step))
  scratch = {}  # what a method's hook leaves for a later phase of this step
  for m in hooks.with_hook(ctx.methods, ctx.config, "after_rollouts"):
    if m.sync_only and producer is not None:
      continue
    gen, state, metrics = m.after_rollouts(
      ctx, run, run.methods[m.name], state, gen, key, step, scratch
    )
    record.update(metrics)
  t1 = time.perf_counter()
  # --- trim, side forwards, advantages, replay -----------------------------------------------
  batch, batch_record = train_batch(ctx, run, state, ref_params, gen, key, step, scratch)
  record.update(batch_record)
  # --- update ------------------------------------------------------------------------------------
  history, versions = state["history"], state["history_versions"]
  if history:  # keep the sampler `staleness` steps behind: push a copy before donation
    history = history[1:] + [jax.tree.map(jnp.copy, state["policy"].params)]
    versions = versions[1:] + [int(state["policy"].step)]
  controls = controls_lib.before_update(cfg, state["controls"], batch)
  for m in hooks.with_hook(ctx.methods, ctx.config, "before_update"):
    controls = m.before_update(ctx, run, run.methods[m.name], controls, batch, step, scratch)
  policy, metrics = run.fns.update(
    state["policy"], batch, controls, jax.random.fold_in(key, streams.tag("update"))
  )
  new_state = {**state, "policy": policy, "history": history, "history_versions": versions}
  if run.layout.record_routes:  # ... and after this step's update
    ro = gen.ro
    metrics = dict(metrics)
    metrics["moe/routing_overlap_after"] = run.fns.routing_overlap(
      run.fns.full(policy.params), ro.tokens, ro.start, ro.routes, ro.completion_mask
    )
  for m in hooks.with_hook(ctx.methods, ctx.config, "side_update"):  # a second model's
    new_state, side_metrics = m.side_update(ctx, run, run.methods[m.name], new_state, scratch)
    metrics = {**metrics, **side_metrics}
  if producer is not None:  # the producer samples from a copy (the state is donated next step)
    producer.publish(jax.tree.map(jnp.copy, policy.params), int(policy.step))
  record = context_lib.as_floats({**record, **metrics})  # one host sync for everything
  _check_prefix(record, run.layout.group)
  record["time/generate_s"] = t1 - t0
  record["time/train_s"] = time.perf_counter() - t1
  record["sampler/weight_version"] = float(gen.version)
  record["sampler/resynced"] = float(run.host.weights.last_resynced)
  # --- controllers, the reference's refresh ----------------------------------------------------
  controls, control_metrics = controls_lib.after_update(cfg, controls, record)
  record.update(control_metrics)
  if "reference" in new_state:  # config.rl.ref_rule (TRL's sync_ref_model)
    new_state, refresh_metrics = controls_lib.refresh_reference(
      cfg, new_state, run.fns.full(policy.params), record, step
    )
    record.update(refresh_metrics)
  for m in hooks.with_hook(ctx.methods, ctx.config, "after_update"):
    new_state, after_metrics = m.after_update(
      ctx, run, run.methods[m.name], new_state, record, step, scratch
    )
    record.update(after_metrics)
  new_state["controls"] = ctx.placement.put_replicated(controls)
  return new_state, record


def train_batch(
  ctx, run, state: dict, ref_params, gen, key, step: int = 0, scratch: dict | None = None
) -> tuple:
  """The update's rows from the step's rollouts ``gen`` (``generation.Generated``): trimmed, with
  the fields the selected pieces read, the advantages, and the scheduler's replayed rows.
  Returns ``(TrainBatch, metrics)``; ``scratch`` (a step's, train/hooks.py) receives the fresh
  ``rows`` and their computed ``fields`` for the methods' later phases."""
  record = dict(gen.metrics)
  sel, ro = gen.sel, gen.ro
  # --- trim: train on the batch's completion width, not the budget ----------------------------
  if run.layout.trim_min:
    width = rollout.trimmed_length(parallel.to_host(ro.completion_mask), run.layout.trim_min)
    if width < ro.completion_mask.shape[1]:
      ro = _trim(ro, width)
    record["batch/width"] = float(width)
  # --- side forwards and advantages (the fields the selected pieces read) -----------------------
  params = run.fns.full(state["policy"].params)
  ref_params = state.get("reference", ref_params)  # refreshed by config.rl.ref_rule
  rows = inputs_lib.Rows(ro, ctx.placement.put_rows(sel.valid, run.layout.gen_rows), gen.rewards)
  src = inputs_lib.Sources(
    fns=run.fns,
    cfg=ctx.config.rl,
    params=params,
    ref_params=ref_params,
    controls=state["controls"],
    state=state,
    methods=run.methods,
    producers=hooks.producers(ctx.methods, ctx.config),
    step=inputs_lib.StepInputs(ctx, run, sel, key),
  )
  batch, fields, metrics = inputs_lib.build_rows(src, rows, run.layout.needs)
  record.update(metrics)
  if run.layout.record_routes:  # the rollout's experts against the trainer's own, before
    record["moe/routing_overlap"] = run.fns.routing_overlap(
      params, ro.tokens, ro.start, ro.routes, ro.completion_mask
    )
  record.update(_batch_metrics(gen))
  if scratch is not None:
    scratch.update(rows=rows, fields=fields)
  # --- replay: the scheduler's stored rows (same builder), then it observes the step ----------
  if run.layout.scheduler_name != "none":
    batch, sched_metrics = _schedule(ctx, run, src, gen, ro, batch, step, key)
    record.update(sched_metrics)
  return batch, record


def _batch_metrics(gen) -> dict:
  """Host statistics of the fresh rows: rewards, verifier errors, lengths, zero-signal groups
  (over real rows only)."""
  sel = gen.sel
  rewards, errors, lengths, truncated = parallel.to_host(
    (gen.rewards, gen.errors, gen.ro.lengths, gen.ro.truncated)
  )
  real = sel.valid > 0
  return {
    "batch/zero_signal_groups": generation.zero_signal_fraction(rewards, sel.group, sel.valid),
    "batch/zero_signal_rollouts": generation.zero_signal_fraction(
      rewards, sel.group, sel.valid, per_rollout=True
    ),
    "reward/mean": float(rewards[real].mean()),
    "reward/std": float(rewards[real].std()),
    "reward/errors": float((errors[real] > 0).sum()),
    "gen/len_mean": float(lengths[real].mean()),
    "gen/truncated": float(truncated[real].mean()),
    "gen/len_p95": float(np.percentile(lengths[real], 95)),
    "gen/len_p99": float(np.percentile(lengths[real], 99)),
  }


def _schedule(ctx, run, src, gen, ro, batch, step: int, key) -> tuple:
  """The prompt scheduler after scoring: ``compose`` appends its ``M`` replayed rows (their
  stored behaviour log-probs and advantages; every other field recomputed by the same builder as
  the fresh rows'), then ``observe``. Returns ``(batch, metrics)``."""
  sched, sel = run.host.scheduler, gen.sel
  host_rewards, host_adv = parallel.to_host((gen.rewards, batch.advantages))
  record = {k: float(v) for k, v in sel.metrics.items()}
  if run.layout.replay_rows:
    rows = scheduling.rows_from_rollout(
      parallel.to_host(ro), advantages=host_adv, rewards=host_rewards, valid=sel.valid
    )
    out = sched.compose(
      step, rows, jax.random.fold_in(key, streams.tag("compose")), uids=sel.row_uids()
    )
    rep = {k: v[run.layout.gen_rows :] for k, v in out.rows.items()}
    record.update(out.metrics)
    put = lambda x: ctx.placement.put_rows(x, run.layout.replay_rows)
    stored = ("advantages", "rewards", "valid", "is_replay", "age")
    replayed = scheduling.rollout_from_rows({k: put(v) for k, v in rep.items() if k not in stored})
    rows = inputs_lib.Rows(replayed, put(rep["valid"].astype(np.float32)), put(rep["rewards"]))
    extra, _, _ = inputs_lib.build_rows(
      src._replace(step=None), rows, run.layout.needs, advantages=put(rep["advantages"])
    )
    batch = run.fns.concat_rows(batch, extra)
  record.update(
    sched.observe(step, sel.problems, host_rewards, sel.group, sel.valid, advantages=host_adv)
  )
  if run.host.event_log is not None:  # the scheduler's events (e.g. review's visits)
    for event in sched.events():
      run.host.event_log.write(event["step"], {k: v for k, v in event.items() if k != "step"})
  return batch, record


def _check_prefix(record: dict, group: int) -> None:
  if record.get("train/prefix_mismatch", 0.0) > 0:
    raise context_lib.TrainingError(
      f"rl: {record['train/prefix_mismatch']:g} rows of the update batch do not share their "
      f"group's prompt (rows g*{group} .. (g+1)*{group}-1 should), which the shared-prompt "
      "forward assumes; set config.rl.shared_prefix=False (and report the layout that "
      "broke it)"
    )
