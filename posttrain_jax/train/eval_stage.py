"""The ``eval`` stage: greedy accuracy, pass@1 and pass@k of a stage's parameters against what
that stage started from, the held-out and extra envs, the active methods' own measures, the RL
curve's summary; writes ``WORKDIR/<stage>/done.json``, ``summary.json``, a table and curves."""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from posttrain_jax import io as ptio
from posttrain_jax import parallel, scheduling
from posttrain_jax.train import (
  contamination_eval,
  hooks,
  pretrain,
  rl,
  teacher_model,
  updates,
  value_benchmark,
  welfare_eval,
)
from posttrain_jax.train import context as context_lib
from posttrain_jax.train import reward_model as reward_model_lib


def _rl_curve_summary(path: str, keys=(), updates_per_step: int | None = None) -> dict:
  """Mean training reward over all RL steps and over the first quarter of them; for each of
  ``keys`` (``config.eval.rl_summary``) the mean (``rl_mean/KEY``), sum (``rl_sum/KEY``),
  maximum (``rl_max/KEY``), first and last value (``rl_first/KEY``, ``rl_last/KEY``) and spike
  (``rl_spike/KEY``: maximum / median, a scale-free peak, e.g. of gradient norms) of that RL
  metric over the steps that logged a finite value.

  Token counts: ``rl_tokens/generated`` = Σ_steps gen/len_mean x rollouts/generated (completion
  tokens sampled); with ``updates_per_step`` (epochs x minibatches, given for token_mean
  aggregation only, whose loss/pg_den is a minibatch's masked completion tokens)
  ``rl_tokens/trained`` = Σ_steps loss/pg_den x updates_per_step (tokens the policy loss saw,
  replayed rows included)."""
  records = ptio.read_jsonl(path) if os.path.exists(path) else []
  rewards = [r["reward/mean"] for r in records if "reward/mean" in r]
  out = {}
  if rewards:  # a search stage's rounds log no reward/mean, only their keys
    quarter = rewards[: max(1, len(rewards) // 4)]
    out = {
      "rl_reward_mean": sum(rewards) / len(rewards),
      "rl_reward_first_quarter": sum(quarter) / len(quarter),
    }
  for key in keys:
    values = [float(r[key]) for r in records if key in r and math.isfinite(float(r[key]))]
    if values:
      out[f"rl_mean/{key}"] = sum(values) / len(values)
      out[f"rl_sum/{key}"] = sum(values)
      out[f"rl_last/{key}"] = values[-1]
      out[f"rl_first/{key}"] = values[0]
      out[f"rl_max/{key}"] = max(values)
      median = float(np.median(values))
      if median > 0:
        out[f"rl_spike/{key}"] = max(values) / median
  generated = [
    float(r["gen/len_mean"]) * float(r["rollouts/generated"])
    for r in records
    if "gen/len_mean" in r and "rollouts/generated" in r
  ]
  if generated:
    out["rl_tokens/generated"] = sum(generated)
  trained = [float(r["loss/pg_den"]) for r in records if "loss/pg_den" in r]
  if trained and updates_per_step:
    out["rl_tokens/trained"] = sum(trained) * updates_per_step
  return out


REPAIR_EDGES = (1, 2, 4, 8, 16, 32, 64, 1 << 30)


def _repair_window(rl_dir: str, out_dir: str) -> dict:
  """The repair-window measurement of a review run (scheduling/review.py): restoration cost
  against review delay from the RL stage's ``review_events.jsonl``, written to the eval stage's
  ``repair_curve.md``; summary scalars over all episodes. {} when the run logged no visit
  events."""
  events = ptio.read_jsonl(os.path.join(rl_dir, rl.REVIEW_EVENTS + ".jsonl"))
  if not events:
    return {}
  episodes = scheduling.restoration_episodes(events)
  curve = scheduling.repair_curve(episodes, REPAIR_EDGES)
  header = [
    "review delay (steps)",
    "episodes",
    "regression rate",
    "restored",
    "mean visits to restore",
    "mean steps",
    "mean rollouts",
  ]
  rows = [
    [
      f"[{r['d_lo']}, {r['d_hi'] if r['d_hi'] < REPAIR_EDGES[-1] else 'inf'})",
      r["episodes"],
      r["regression_rate"],
      r["restored"],
      r["mean_visits"],
      r["mean_steps"],
      r["mean_rollouts"],
    ]
    for r in curve
    if r["episodes"]
  ]
  with open(os.path.join(out_dir, "repair_curve.md"), "w", encoding="utf-8") as f:
    f.write(ptio.format_table(header, rows) + "\n")
  regressed = [e for e in episodes if e["regressed"]]
  restored = [e for e in regressed if e["restored"]]
  return {
    "review_episodes": len(episodes),
    "review_regression_rate": len(regressed) / len(episodes) if episodes else float("nan"),
    "review_restoration_rollouts": (
      sum(e["rollouts"] for e in restored) / len(restored) if restored else float("nan")
    ),
  }


def lm_loss_fn(ctx):
  """``params -> mean NLL`` on ``config.eval.lm_loss_examples`` rows of the env's pretraining
  corpus (``pretrain.corpus_noise``, ``env.level``) drawn with the evaluation's key, or None
  when the setting is 0: a general-text loss proxy beside the task metrics."""
  n = int(ctx.config.eval.lm_loss_examples)
  if not n:
    return None
  key = jax.random.fold_in(ctx.eval_key, 17)
  pairs = ctx.env.corpus(
    key, n, level=ctx.config.env.level, noise=float(ctx.config.pretrain.corpus_noise)
  )
  pairs = [(context_lib.prompt_text(ctx.tokenizer, p, ctx.chat_template), c) for p, c in pairs]
  longest = max(len(x) for x in ctx.tokenizer([p + c for p, c in pairs])["input_ids"]) + 1
  rows = pretrain.tokenize_pairs(ctx.tokenizer, pairs, longest)
  tokens, mask = jnp.asarray(rows["tokens"]), jnp.asarray(rows["loss_mask"])
  fn = jax.jit(lambda p: updates.supervised_nll(ctx.graphdef, p, tokens, mask))
  return lambda params: float(fn(params))


def run_eval_stage(ctx, before, after, *, stage: str = "eval", rl_stage: str | None = "rl") -> dict:
  """Evaluates ``before`` (what the evaluated stage started from) and ``after`` (its result;
  None: ``before`` alone); writes ``WORKDIR/<stage>/done.json``, ``WORKDIR/summary.json``, a
  table and a PNG. ``rl_stage``: the RL stage whose curve is summarised (None: none)."""
  out_dir = ctx.stage_dir(stage)
  evaluator = ctx.make_evaluator()
  heldout = ctx.make_evaluator(pass_n=0, heldout=True) if ctx.heldout_env is not None else None
  method_evals = [  # the active methods' own measures (e.g. recovery from wrong prefixes)
    m.evaluate(ctx) for m in hooks.with_hook(ctx.methods, ctx.config, "evaluate")
  ]
  state_values = {  # the active methods' values of SVEB's states (the PPO critic)
    m.name: m.state_values(ctx, rl_stage)
    for m in hooks.with_hook(ctx.methods, ctx.config, "state_values")
  }
  extras = {name: ctx.make_evaluator(extra=name) for name in ctx.extra_envs}
  lm_loss = lm_loss_fn(ctx)
  ecfg = ctx.config.eval
  k = ecfg.pass_k
  rows, summary = (
    [],
    {
      "k": k,
      "env": ctx.config.env.name,
      "level": ctx.config.env.level,
      "seed": ctx.config.seed,
      "num_eval_problems": len(ctx.eval_problems),
    },
  )
  for name, params in (("before_rl", before), ("after_rl", after)):
    if params is None:
      continue
    m = evaluator(params, ctx.eval_key)
    summary[f"accuracy_{name}"] = m["eval/accuracy"]
    summary[f"pass_at_1_{name}"] = m["eval/pass@1"]
    summary[f"pass_at_k_{name}"] = m[f"eval/pass@{k}"]
    summary[f"len_mean_{name}"] = m["eval/len_mean"]
    summary[f"truncated_{name}"] = m["eval/truncated"]
    summary[f"distinct_correct_{name}"] = m["eval/distinct_correct"]
    summary[f"reward_errors_{name}"] = sum(
      v
      for k, v in m.items()  # failed reward calls
      if k.startswith("eval/reward/errors/")
    )
    for key in ("tool_calls", "call_rate"):  # multi-turn runs (methods/agent/)
      if f"eval/{key}" in m:
        summary[f"{key}_{name}"] = m[f"eval/{key}"]
    rows.append(
      [
        name,
        m["eval/accuracy"],
        m["eval/pass@1"],
        m[f"eval/pass@{k}"],
        m["eval/len_mean"],
        m["eval/truncated"],
      ]
    )
    for method_eval in method_evals:
      summary.update({f"{key}_{name}": v for key, v in method_eval(params).items()})
    for env_name, extra in extras.items():  # config.eval.extra_envs
      key = env_name.replace("/", "_")
      summary[f"accuracy_{key}_{name}"] = extra(params, ctx.eval_key)["eval/extra_accuracy"]
    if extras:  # their mean: every domain of a multi-domain run at once
      summary[f"accuracy_extra_mean_{name}"] = float(
        np.mean([summary[f"accuracy_{e.replace('/', '_')}_{name}"] for e in extras])
      )
    if lm_loss is not None:
      summary[f"lm_loss_{name}"] = lm_loss(params)
    if ecfg.lara_seen:  # contamination detection (train/contamination_eval.py)
      lara = contamination_eval.evaluate(
        ctx, params, seen=ecfg.lara_seen, unseen=ecfg.lara_unseen, reference=ecfg.lara_reference
      )
      summary.update({f"{key}_{name}": v for key, v in lara.items()})
    if ecfg.sveb:  # value estimators against Monte-Carlo values (train/value_benchmark.py)
      sveb = value_benchmark.benchmark(
        ctx,
        params,
        prompts=ecfg.sveb_prompts,
        group=ecfg.sveb_group,
        cuts=ecfg.sveb_cuts,
        continuations=ecfg.sveb_continuations,
        extra={m: values for m, for_policy in state_values.items() if (values := for_policy(name))},
      )
      summary.update({f"{key}_{name}": v for key, v in sveb.items()})
    if heldout is not None:  # generalisation to config.eval.heldout_env
      summary[f"accuracy_heldout_{name}"] = heldout(params, ctx.eval_key)["eval/heldout_accuracy"]
  if ecfg.welfare and after is not None:  # the welfare axis: after RL against its start
    summary.update(
      welfare_eval.evaluate(
        ctx,
        before,
        after,
        layer=ecfg.welfare_layer,
        n=ecfg.welfare_examples,
        alpha=ecfg.welfare_alpha,
      )
    )
  if ctx.is_done(teacher_model.STAGE):  # a teacher of its own: how good it is
    summary["teacher_accuracy"] = ctx.done_summary(teacher_model.STAGE).get("eval/accuracy")
  if ctx.is_done(reward_model_lib.STAGE):  # the reward model's held-out pairwise accuracy
    summary["reward_model_accuracy"] = ctx.done_summary(reward_model_lib.STAGE).get("eval/accuracy")
  if not ctx.is_primary:  # every process evaluated (SPMD); process 0 writes the results
    parallel.barrier("eval_stage")
    return summary
  rl_cfg = ctx.config.rl
  rl_metrics = os.path.join(ctx.workdir, rl_stage or "", "metrics.jsonl")
  summary.update(
    _rl_curve_summary(
      rl_metrics if rl_stage else "",
      tuple(ctx.config.eval.rl_summary),
      rl_cfg.epochs * rl_cfg.minibatches if rl_cfg.aggregation == "token_mean" else None,
    )
  )
  if rl_stage:
    summary.update(_repair_window(os.path.join(ctx.workdir, rl_stage), out_dir))
  for metric in ("accuracy", "pass_at_1", "pass_at_k"):  # the evaluated stage's gain
    if f"{metric}_before_rl" in summary and f"{metric}_after_rl" in summary:
      summary[f"{metric}_gain"] = summary[f"{metric}_after_rl"] - summary[f"{metric}_before_rl"]
  # Accuracy x token efficiency (an AES analogue): greedy-accuracy gain of the RL stage per
  # million tokens it sampled plus trained on.
  tokens = summary.get("rl_tokens/generated", 0.0) + summary.get("rl_tokens/trained", 0.0)
  if (
    "rl_tokens/trained" in summary
    and tokens > 0
    and "accuracy_before_rl" in summary
    and "accuracy_after_rl" in summary
  ):
    summary["accuracy_gain_per_mtoken"] = (
      summary["accuracy_after_rl"] - summary["accuracy_before_rl"]
    ) / (tokens / 1e6)
  header = [
    "policy",
    "greedy accuracy",
    "pass@1 (T=1)",
    f"pass@{k} (T=1)",
    "mean length",
    "truncated",
  ]
  table = ptio.format_table(header, rows)
  with open(os.path.join(out_dir, "table.md"), "w", encoding="utf-8") as f:
    f.write(table + "\n")
  panels = [
    (
      "pretrain",
      os.path.join(ctx.workdir, "pretrain", "metrics.jsonl"),
      ["loss/nll", "eval/accuracy"],
    ),
    (rl_stage or "rl", rl_metrics, ["reward/mean", "eval/accuracy"]),
  ]
  ptio.plot_curves(
    panels,
    os.path.join(ctx.workdir, "curves.png"),
    title=f"{ctx.config.env.name} level {ctx.config.env.level}, seed {ctx.config.seed}",
  )
  context_lib.write_json(os.path.join(ctx.workdir, "summary.json"), summary)
  context_lib.write_json(os.path.join(out_dir, "done.json"), summary)
  print(f"\n[{stage}]\n" + table, flush=True)
  print(
    f"\nsummary: {os.path.join(ctx.workdir, 'summary.json')}   curves: "
    f"{os.path.join(ctx.workdir, 'curves.png')}",
    flush=True,
  )
  parallel.barrier("eval_stage")
  return summary
