"""Runs an experiment config's stages in order; a rerun skips finished stages and resumes others."""

import dataclasses
import functools
import json
import math
import os
import sys
import tempfile

import jax
import ml_collections
from flax import nnx

from posttrain_jax import io as ptio
from posttrain_jax import models, parallel, scheduling
from posttrain_jax.parallel import compile_cache
from posttrain_jax.train import context as context_lib
from posttrain_jax.train import defaults, hooks, pretrain, rl
from posttrain_jax.train import reward_model as reward_model_lib
from posttrain_jax.train import state as state_lib
from posttrain_jax.train import teacher as teacher_lib
from posttrain_jax.train import validate as validate_lib
from posttrain_jax.train import workdir as workdir_lib

ConfigError = validate_lib.ConfigError


def workdir_path(workdir: str | None) -> str:
  """``workdir`` as an absolute path, or ConfigError when none was given."""
  if not workdir:
    raise ConfigError("no --workdir given; pass --workdir=DIR (e.g. runs/quickstart)")
  return os.path.abspath(workdir)


def prepare_workdir(workdir: str | None) -> str:
  """Creates ``workdir`` and proves it is writable, or raises ConfigError saying so."""
  workdir = workdir_path(workdir)
  try:
    os.makedirs(workdir, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=workdir):
      pass
  except OSError as e:
    raise ConfigError(
      f"workdir {workdir} is not writable ({e.strerror}); pass a --workdir you can write to"
    ) from None
  return workdir


def _stage_params(ctx, stage, runner, *args):
  """Final params of ``stage``: loaded if it finished before, else trained now."""
  if ctx.is_done(stage):
    params = ctx.load_final(stage)  # None: bad final set aside (fallback), finish it again
    if params is not None:
      print(f"[{stage}] already finished in {ctx.stage_dir(stage)}; skipping", file=sys.stderr)
      return params
  return runner(ctx, *args)


def _rl_curve_summary(path: str, keys=(), updates_per_step: int | None = None) -> dict:
  """Mean training reward over all RL steps and over the first quarter of them; for each of
  ``keys`` (``config.eval.rl_summary``) the mean (``rl_mean/KEY``), sum (``rl_sum/KEY``),
  maximum (``rl_max/KEY``) and last value (``rl_last/KEY``) of that RL metric over the steps
  that logged a finite value.

  Token counts: ``rl_tokens/generated`` = Σ_steps gen/len_mean x rollouts/generated (completion
  tokens sampled); with ``updates_per_step`` (epochs x minibatches, given for token_mean
  aggregation only, whose loss/pg_den is a minibatch's masked completion tokens)
  ``rl_tokens/trained`` = Σ_steps loss/pg_den x updates_per_step (tokens the policy loss saw,
  replayed rows included)."""
  records = ptio.read_jsonl(path) if os.path.exists(path) else []
  rewards = [r["reward/mean"] for r in records if "reward/mean" in r]
  if not rewards:
    return {}
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
      out[f"rl_max/{key}"] = max(values)
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


def _repair_window(workdir: str, out_dir: str) -> dict:
  """The repair-window measurement of a review run (scheduling/review.py): restoration cost
  against review delay from ``rl/review_events.jsonl``, written to ``eval/repair_curve.md``;
  summary scalars over all episodes. {} when the run logged no visit events."""
  events = ptio.read_jsonl(os.path.join(workdir, "rl", rl.REVIEW_EVENTS + ".jsonl"))
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


def run_eval_stage(ctx, before, after) -> dict:
  """Evaluates the parameters before and after RL; writes summary.json, a table and a PNG."""
  out_dir = ctx.stage_dir("eval")
  evaluator = ctx.make_evaluator()
  heldout = ctx.make_evaluator(pass_n=0, heldout=True) if ctx.heldout_env is not None else None
  method_evals = [  # the active methods' own measures (e.g. recovery from wrong prefixes)
    m.evaluate(ctx) for m in hooks.with_hook(ctx.methods, ctx.config, "evaluate")
  ]
  extras = {name: ctx.make_evaluator(extra=name) for name in ctx.extra_envs}
  k = ctx.config.eval.pass_k
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
    for key in ("tool_calls", "call_rate"):  # multi-turn runs (train/agents.py)
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
    for env_name, ev in extras.items():  # config.eval.extra_envs
      key = env_name.replace("/", "_")
      summary[f"accuracy_{key}_{name}"] = ev(params, ctx.eval_key)["eval/extra_accuracy"]
    if heldout is not None:  # generalisation to config.eval.heldout_env
      summary[f"accuracy_heldout_{name}"] = heldout(params, ctx.eval_key)["eval/heldout_accuracy"]
  if ctx.is_done(teacher_lib.STAGE):  # a teacher of its own: how good it is
    summary["teacher_accuracy"] = ctx.done_summary(teacher_lib.STAGE).get("eval/accuracy")
  if ctx.is_done(reward_model_lib.STAGE):  # the reward model's held-out pairwise accuracy
    summary["reward_model_accuracy"] = ctx.done_summary(reward_model_lib.STAGE).get("eval/accuracy")
  if not ctx.is_primary:  # every process evaluated (SPMD); process 0 writes the results
    parallel.barrier("eval_stage")
    return summary
  rl_cfg = ctx.config.rl
  summary.update(
    _rl_curve_summary(
      os.path.join(ctx.workdir, "rl", "metrics.jsonl"),
      tuple(ctx.config.eval.rl_summary),
      rl_cfg.epochs * rl_cfg.minibatches if rl_cfg.aggregation == "token_mean" else None,
    )
  )
  summary.update(_repair_window(ctx.workdir, out_dir))
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
    ("rl", os.path.join(ctx.workdir, "rl", "metrics.jsonl"), ["reward/mean", "eval/accuracy"]),
  ]
  ptio.plot_curves(
    panels,
    os.path.join(ctx.workdir, "curves.png"),
    title=f"{ctx.config.env.name} level {ctx.config.env.level}, seed {ctx.config.seed}",
  )
  context_lib.write_json(os.path.join(ctx.workdir, "summary.json"), summary)
  context_lib.write_json(os.path.join(out_dir, "done.json"), summary)
  print("\n" + table, flush=True)
  print(
    f"\nsummary: {os.path.join(ctx.workdir, 'summary.json')}   curves: "
    f"{os.path.join(ctx.workdir, 'curves.png')}",
    flush=True,
  )
  parallel.barrier("eval_stage")
  return summary


def load_final(workdir: str, stage: str):
  """``(params, ModelConfig, tokenizer)`` of a finished ``stage`` of the run in ``workdir``: its
  final parameters, and the run's tokenizer (or, for a run started from a Hugging Face folder,
  that folder's). Raises FileNotFoundError when the stage has no final parameters."""
  path = os.path.join(workdir, stage, "final")
  if not os.path.isdir(path):
    raise FileNotFoundError(
      f"run {workdir} has no final parameters for stage {stage!r} ({path} is missing)"
    )
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    model_cfg = ml_collections.ConfigDict(json.load(f)["model"])
  hf_path = model_cfg.get("hf_path", "") or ""
  tokenizer = (
    models.load_hf_tokenizer(hf_path)
    if hf_path
    else models.load_tokenizer(os.path.join(workdir, "tokenizer"))
  )
  graphdef, target = state_lib.build_model(model_cfg, len(tokenizer), 0)
  ckpt = ptio.Checkpointer(path, max_to_keep=1)
  try:
    params, _ = ckpt.restore(target)
  finally:
    ckpt.close()
  return params, nnx.merge(graphdef, target).config, tokenizer


def run(
  config,
  workdir: str | None,
  *,
  methods: tuple,
  rerun: bool = False,
  fallback_checkpoint: bool = False,
) -> dict:
  """Validates ``config``, then runs its stages under ``workdir``, holding the workdir's lock
  (train/workdir.py). A workdir made with a config that differs in a key that changes results
  is refused (ConfigError), unless ``rerun``: then the stages it affects run again.
  ``fallback_checkpoint``: a checkpoint (or a stage's final parameters) that fails its checksum
  or cannot be read is set aside (renamed ``*.corrupt``) and the run continues from the
  previous one, instead of stopping with a CheckpointError. ``methods``: the METHODS table
  (``posttrain_jax.methods``; ``posttrain_jax.methods.run`` passes it). Returns the eval
  summary."""
  validate_lib.validate(config, methods=methods)
  context_lib.apply_cpu_devices(config)  # before anything starts JAX's backend
  try:  # before the first compilation
    compile_cache.enable(config.compilation_cache_dir)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  workdir = workdir_path(workdir)
  with workdir_lib.lock(workdir):  # before anything is written
    prepare_workdir(workdir)
    fresh = workdir_lib.unused(workdir)
    workdir_lib.reconcile(workdir, config, rerun=rerun)
    try:  # builds the tokenizer and checks what needs it (sequence lengths, vocabulary fit)
      ctx = context_lib.make_context(config, workdir, methods=methods)
    except Exception:
      if fresh:  # a refused first run leaves the workdir as it found it
        workdir_lib.forget(workdir)
      raise
    ctx.fallback_checkpoint = fallback_checkpoint
    return _run_stages(ctx)


def _run_stages(ctx) -> dict:
  """Runs ``config.stages`` in order; a finished stage is loaded, not run again."""
  stages = tuple(ctx.config.stages)
  before = after = None
  if "pretrain" in stages:
    before = _stage_params(ctx, "pretrain", pretrain.run)
  else:
    before = ctx.init_params
  if teacher_lib.STAGE in stages:  # a teacher of its own (config.rl.teacher.source='stage')
    _stage_params(
      teacher_lib.stage_context(ctx),
      teacher_lib.STAGE,
      functools.partial(
        pretrain.run, stage=teacher_lib.STAGE, **teacher_lib.pretrain_overrides(ctx.config)
      ),
    )
  if reward_model_lib.STAGE in stages:  # a reward model; RL's reward terms load it from disk
    if ctx.is_done(reward_model_lib.STAGE):
      print(
        f"[{reward_model_lib.STAGE}] already finished in "
        f"{ctx.stage_dir(reward_model_lib.STAGE)}; skipping",
        file=sys.stderr,
      )
    else:
      reward_model_lib.run(ctx, before)
  if "rl_base" in stages:  # an RL stage before the main one; its result is RL's start
    base_ctx = dataclasses.replace(ctx, config=defaults.rl_base_config(ctx.config))
    before = _stage_params(base_ctx, "rl_base", functools.partial(rl.run, stage="rl_base"), before)
  if "rl" in stages:
    after = _stage_params(ctx, "rl", rl.run, before)
  summary = {}
  if "eval" in stages:
    summary = run_eval_stage(ctx, before, after)
  jax.effects_barrier()
  return summary
