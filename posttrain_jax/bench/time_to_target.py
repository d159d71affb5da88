"""Time to target: wall seconds of GRPO until held-out greedy accuracy first reaches a target.

The figure users feel (issue 5): from one pretrained checkpoint on 3-digit addition, exported
to Hugging Face format so a peer (scripts/peers/trl_time_to_target.py) starts from the very same
weights, run GRPO with the same hyperparameters and time how long it takes until greedy accuracy
on the same held-out problems first reaches ``target`` (60%).

* The checkpoint: the quickstart's pretraining (``defaults.addition_base``: tiny model, 1,000
  steps on a corpus whose answers forget every carry half of the time), seed 0, written by
  :func:`prepare` as a Hugging Face folder next to ``problems.json`` (the held-out problems
  and a pool of training prompts, both drawn from our env, for the peer).
* GRPO: the quickstart's RL hyperparameters (16 prompts x 8 rollouts, 6 new tokens, temperature
  1, AdamW lr 1e-4, b2 0.99, clip 1.0, no weight decay, no KL; group mean/std advantages, clipped
  ratio loss averaged over the batch's tokens = TRL's ``loss_type='dapo'``,
  ``scale_rewards='group'``).
* The clock runs from just before the first RL iteration (so our compilation counts; setup
  before it, such as loading the checkpoint, is reported apart as ``setup_s``) and stops while
  evaluating: every ``eval_every`` steps the held-out accuracy is measured off the clock, and the
  run stops at the first evaluation at or above the last threshold. ``thresholds`` adds
  intermediate targets to the record (seconds and steps at which each was first reached).
"""

import json
import os
import statistics
import tempfile
import time

import jax

from posttrain_jax import defaults, models, parallel, streams
from posttrain_jax import methods as methods_lib
from posttrain_jax.bench import speed as bench
from posttrain_jax.train import experiment
from posttrain_jax.train import rl_step as step_lib

TARGET = 0.6
THRESHOLDS = (0.6, 0.8, 0.9)
EVAL_PROBLEMS = 500
EVAL_EVERY = 5
MAX_STEPS = 300
TRAIN_POOL = 20000
PROBLEMS_FILE = "problems.json"


def pretrain_config(seed: int = 0):
  """The checkpoint's pretraining run: the quickstart's (``defaults.addition_base``)."""
  c = defaults.addition_base(seed)
  c.stages = ("pretrain",)
  c.progress = c.tensorboard = False
  return c


def rl_config(hf_dir: str, seed: int, *, eval_problems: int = EVAL_PROBLEMS):
  """Our GRPO run from the exported checkpoint: the quickstart's RL hyperparameters."""
  base = defaults.addition_base(seed)
  c = defaults.base_config()
  c.seed = seed
  c.stages = ("rl",)
  c.progress = c.tensorboard = False
  c.env.name, c.env.level = base.env.name, base.env.level
  c.model.update(hf_path=hf_dir, dtype="float32")
  c.rl.update(
    steps=MAX_STEPS,
    prompts_per_step=base.rl.prompts_per_step,
    group_size=base.rl.group_size,
    lr=base.rl.lr,
    max_new_tokens=base.rl.max_new_tokens,
    temperature=1.0,
    kl_coef=0.0,
    eval_every=0,
  )
  c.eval.num_problems = eval_problems
  return c


def hyperparameters(config) -> dict:
  """What the peer must match, read from our config (written to problems.json)."""
  r = config.rl
  return dict(
    prompts=r.prompts_per_step,
    group=r.group_size,
    max_new=r.max_new_tokens,
    lr=r.lr,
    b1=r.get("b1", 0.9),
    b2=r.b2,
    weight_decay=r.weight_decay,
    grad_clip=r.grad_clip,
    temperature=r.temperature,
    beta=r.kl_coef,
    clip_eps=dict(r.policy_loss_kwargs).get("clip_low", 0.2),
  )


def prepare(
  cache_dir: str,
  *,
  source: str | None = None,
  eval_problems: int = EVAL_PROBLEMS,
  pretrain_seed: int = 0,
) -> str:
  """The Hugging Face folder of the checkpoint under ``cache_dir`` (built once).

  ``source``: a run workdir with a finished ``pretrain`` stage to export (e.g. the quickstart's
  ``runs/quickstart``); without it the quickstart's pretraining runs into
  ``cache_dir/pretrain_run`` (about 2-7 minutes on 2 cores). Also writes ``problems.json``: the
  held-out problems (our eval split) and a pool of training prompts (our train split). A
  folder that has both is reused when it matches the request (the same ``source``, if one is
  given, and ``eval_problems``); otherwise a ValueError says to delete it or choose another."""
  hf_dir = os.path.join(cache_dir, "hf")
  problems_path = os.path.join(cache_dir, PROBLEMS_FILE)
  if os.path.isfile(os.path.join(hf_dir, "config.json")) and os.path.isfile(problems_path):
    with open(problems_path, encoding="utf-8") as f:
      stored = json.load(f)
    same_source = source is None or stored.get("source") == os.path.abspath(source)
    if not same_source or len(stored.get("heldout", ())) != eval_problems:
      raise ValueError(
        f"{cache_dir} holds a checkpoint prepared from {stored.get('source')} with "
        f"{len(stored.get('heldout', ()))} held-out problems, not from "
        f"{os.path.abspath(source) if source else 'any source'} with {eval_problems}; delete "
        "the folder (or choose another, e.g. --ttt_dir) to prepare it again"
      )
    return hf_dir
  os.makedirs(cache_dir, exist_ok=True)
  if source is None:
    source = os.path.join(cache_dir, "pretrain_run")
    methods_lib.run(pretrain_config(pretrain_seed), source)
  params, config, tokenizer = _load_pretrained(source)
  models.hf.save_pretrained(params, config, hf_dir, tokenizer=tokenizer)
  with tempfile.TemporaryDirectory(prefix="ttt_ctx_") as tmp:
    ctx = methods_lib.make_context(rl_config(hf_dir, 0, eval_problems=eval_problems), tmp)
  train = ctx.env.sample(
    jax.random.key(pretrain_seed + 1), TRAIN_POOL, level=ctx.config.env.level, split="train"
  )
  as_rows = lambda ps: [{"prompt": t, "answer": p.answer} for t, p in zip(ctx.prompt_texts(ps), ps)]
  with open(os.path.join(cache_dir, PROBLEMS_FILE), "w", encoding="utf-8") as f:
    json.dump(
      {
        "source": os.path.abspath(source),
        "heldout": as_rows(ctx.eval_problems),
        "train": as_rows(train),
        "hyperparameters": hyperparameters(ctx.config),
      },
      f,
    )
  return hf_dir


def _load_pretrained(workdir: str):
  """(params, ModelConfig, tokenizer) of the final ``pretrain`` parameters of a run."""
  path = os.path.join(workdir, "pretrain", "final")
  if not os.path.isdir(path):
    raise FileNotFoundError(
      f"{workdir} has no finished pretrain stage ({path} is missing); "
      "run the quickstart's pretraining there first or omit the source"
    )
  return experiment.load_final(workdir, "pretrain")


def first_reached(curve: list[dict], thresholds) -> dict:
  """For each threshold, the first point of ``curve`` (dicts with ``accuracy``, ``seconds``,
  ``step``) at or above it: ``{str(t): {'seconds', 'step'} or None}``."""
  out = {}
  for t in thresholds:
    hit = next((p for p in curve if p["accuracy"] >= t), None)
    out[f"{t:g}"] = None if hit is None else {"seconds": hit["seconds"], "step": hit["step"]}
  return out


def run_ours(
  hf_dir: str,
  seed: int,
  *,
  thresholds=THRESHOLDS,
  eval_every: int = EVAL_EVERY,
  max_steps: int = MAX_STEPS,
  eval_problems: int = EVAL_PROBLEMS,
  workdir: str | None = None,
  max_new: int | None = None,
  trim: bool = True,
) -> dict:
  """One seed of our GRPO from ``hf_dir`` until greedy held-out accuracy reaches
  ``max(thresholds)`` (or ``max_steps``); returns the record (curve, seconds to each
  threshold, setup and compile seconds). ``max_new``: a generation budget other than the
  quickstart's (answers still end at EOS); ``trim``: ``config.rl.trim_completions``."""
  if not thresholds or eval_every < 1 or max_steps < 1:
    raise ValueError("time_to_target needs thresholds, eval_every >= 1 and max_steps >= 1")
  if max_new is not None and max_new < 1:
    raise ValueError(f"time_to_target: max_new must be >= 1, got {max_new}")
  t_setup = time.perf_counter()
  config = rl_config(hf_dir, seed, eval_problems=eval_problems)
  config.rl.steps = max_steps
  config.rl.trim_completions = bool(trim)
  if max_new is not None:
    config.rl.max_new_tokens = int(max_new)
  with tempfile.TemporaryDirectory() as tmp:
    ctx, run_state, rl_run, _ = bench.rl_setup(config, workdir or tmp)
    evaluator = ctx.make_evaluator(eval_problems, pass_n=0)
    key = jax.random.fold_in(ctx.key, streams.tag("rl"))
    setup_s = time.perf_counter() - t_setup
    t = time.perf_counter()
    first = evaluator(run_state["policy"].params, ctx.eval_key)["eval/accuracy"]
    eval_s = [time.perf_counter() - t]  # includes compiling the greedy sampler
    curve = [{"step": 0, "seconds": 0.0, "accuracy": first}]
    clock, iteration_s, reward, widths = 0.0, [], [], set()
    for step in range(max_steps):
      if curve[-1]["accuracy"] >= max(thresholds):
        break
      t = time.perf_counter()
      run_state, record = step_lib.rl_step(
        ctx, rl_run, run_state, None, jax.random.fold_in(key, step), step
      )
      jax.block_until_ready(run_state["policy"].params)
      iteration_s.append(time.perf_counter() - t)
      clock += iteration_s[-1]
      reward.append(record["reward/mean"])
      if "batch/width" in record:
        widths.add(int(record["batch/width"]))
      if (step + 1) % eval_every == 0 or step + 1 == max_steps:
        t = time.perf_counter()
        acc = evaluator(run_state["policy"].params, ctx.eval_key)["eval/accuracy"]
        eval_s.append(time.perf_counter() - t)
        curve.append(
          {
            "step": step + 1,
            "seconds": clock,
            "accuracy": acc,
            "reward": statistics.fmean(reward[-eval_every:]),
          }
        )
  reached = first_reached(curve, thresholds)
  steady = iteration_s[2:] or iteration_s
  return {
    "framework": "posttrain_jax",
    "seed": seed,
    "target": min(thresholds),
    "seconds_to_target": (reached[f"{min(thresholds):g}"] or {}).get("seconds"),
    "reached": reached,
    "curve": curve,
    "start_accuracy": first,
    "steps": len(iteration_s),
    "setup_s": setup_s,
    "first_iteration_s": iteration_s[0] if iteration_s else None,
    "iteration_s": statistics.median(steady) if steady else None,
    "eval_s": sum(eval_s),
    "eval_problems": eval_problems,
    "eval_every": eval_every,
    "batch_widths": sorted(widths),
    "executables": parallel.executables.stats(),
    "hyperparameters": hyperparameters(config),
    "backend": jax.default_backend(),
  }


def summarize(records: list[dict]) -> dict:
  """Median over seeds of the seconds (and steps) to the target; a seed that never reached it
  counts as infinitely slow (the median is then None when most seeds failed)."""
  inf = float("inf")
  secs = sorted(
    r["seconds_to_target"] if r["seconds_to_target"] is not None else inf for r in records
  )
  steps = sorted((r["reached"][f"{r['target']:g}"] or {}).get("step", inf) for r in records)
  med = lambda xs: statistics.median(xs) if xs else None
  median_s, median_steps = med(secs), med(steps)
  return {
    "seeds": [r["seed"] for r in records],
    "median_seconds_to_target": None if median_s in (None, inf) else median_s,
    "median_steps_to_target": None if median_steps in (None, inf) else median_steps,
    "reached": sum(r["seconds_to_target"] is not None for r in records),
    "median_iteration_s": med([r["iteration_s"] for r in records if r["iteration_s"] is not None]),
    "median_setup_s": med([r["setup_s"] for r in records]),
  }
