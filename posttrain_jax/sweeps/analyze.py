"""Named analyses of a finished run's checkpoints (``scripts/analyze.py``).

``plasticity``: for each listed stage of the run in ``workdir``, on the same gold rows of the
run's env (its noise-free transcripts, or a JSONL file of prompt-completion lines): the loss,
the over-confidence of the next-token distribution (mean max-prob, entropy), SAM-style
sharpness at radius ``rho`` (analysis/plasticity.py), and the cosine of each stage's loss
gradient with the first stage's, overall and for the MLP and attention modules. With
``against`` (another run's workdir, the same model), the share of this run's top-changed MLP
neurons of ``stage`` relative to ``base_stage`` that are also the other run's
(modelops.neurons.top_changed_overlap). Writes ``WORKDIR/analysis/plasticity.md`` and
``.json``.

``domains`` (multi-domain RL, methods_A.md section 14): for a run of several RL stages on
different envs, every domain's greedy accuracy and gold-row NLL after every stage (rows =
stages, columns = domains), and for each stage after the first and each domain the damage the
stage's update did to that domain's NLL, predicted to second order from the previous stage's
parameters (analysis/interference.py: the gradient term, the Hessian-vector term) beside the
measured change, with the Spearman rank correlation of predicted and measured over all (stage,
domain) pairs. Writes ``WORKDIR/analysis/domains.md`` and ``.json``.
"""

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from scipy import stats

from posttrain_jax import methods as methods_lib
from posttrain_jax.analysis import interference, plasticity
from posttrain_jax.modelops import neurons
from posttrain_jax.sweeps import inside
from posttrain_jax.train import context as context_lib
from posttrain_jax.train import experiment, pretrain, sft

MODULES = ("layers/gate", "layers/up", "layers/down", "layers/attn")


def stored_config(workdir: str) -> ml_collections.ConfigDict:
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{workdir} holds no run (no config.json); give a run's --workdir")
  with open(path, encoding="utf-8") as f:
    return ml_collections.ConfigDict(json.load(f))


def gold_rows(ctx, examples: int, source: str = "env") -> dict:
  """``examples`` gold (prompt, completion) rows tokenised as ``tokenize_pairs`` does."""
  cfg = ml_collections.ConfigDict(dict(source=source, examples=examples, level=0, noise=0.0))
  pairs = sft.examples(ctx, cfg)
  rows = pretrain.tokenize_pairs(ctx.tokenizer, pairs, sft.sequence_length(ctx.tokenizer, pairs))
  return {k: jnp.asarray(v) for k, v in rows.items()}


def _module_cos(cos: dict, module: str) -> float:
  keys = [k for k in cos if k.startswith(module)]
  return float(sum(cos[k] for k in keys) / len(keys)) if keys else float("nan")


def plasticity_table(
  workdir: str,
  stages,
  *,
  rho: float = 0.05,
  examples: int = 256,
  source: str = "env",
  against: str | None = None,
  base_stage: str = "pretrain",
  stage: str | None = None,
  fraction: float = 0.05,
) -> dict:
  """The plasticity analysis's rows (one per stage) and, with ``against``, the neuron
  overlap; written to ``workdir/analysis/plasticity.{md,json}``."""
  config = stored_config(workdir)
  ctx = methods_lib.make_context(config, workdir, check_memory=False)
  rows = gold_rows(ctx, examples, source)
  tokens, mask = rows["tokens"], rows["loss_mask"]
  out, first_grad = [], None
  for name in stages:
    params = experiment.load_final(workdir, name)[0]
    conf = plasticity.confidence(ctx.graphdef, params, tokens, mask)
    sharp = plasticity.sharpness(ctx.graphdef, params, tokens, mask, rho=rho)
    g = plasticity.grad(ctx.graphdef, params, tokens, mask)
    first_grad = g if first_grad is None else first_grad
    cos = plasticity.cosines(first_grad, g)
    row = {
      "stage": name,
      "loss": float(sharp["loss"]),
      "max_prob": float(conf["max_prob"]),
      "entropy": float(conf["entropy"]),
      "sharpness": float(sharp["sharpness"]),
      "grad_cos_first": float(cos["all"]),
    }
    row.update({f"grad_cos_first/{m}": _module_cos(cos, m) for m in MODULES})
    out.append(row)
  result = {"workdir": workdir, "rho": rho, "examples": examples, "rows": out}
  if against is not None:
    stage = stage or stages[-1]
    base = experiment.load_final(workdir, base_stage)[0]
    mine = experiment.load_final(workdir, stage)[0]
    theirs = experiment.load_final(against, stage)[0]
    result["neuron_overlap"] = {
      "against": against,
      "stage": stage,
      "base_stage": base_stage,
      "fraction": fraction,
      "overlap": neurons.top_changed_overlap(base, mine, theirs, fraction),
    }
  _write(workdir, result)
  return result


def _write(workdir: str, result: dict) -> None:
  folder = os.path.join(workdir, "analysis")
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, "plasticity.json"), "w", encoding="utf-8") as f:
    json.dump(result, f, indent=2, sort_keys=True)
  with open(os.path.join(folder, "plasticity.md"), "w", encoding="utf-8") as f:
    f.write(markdown(result))


def markdown(result: dict) -> str:
  cols = [k for k in result["rows"][0] if k != "stage"]
  lines = [
    f"# Plasticity of {result['workdir']} ({result['examples']} gold rows, rho {result['rho']})",
    "",
    "| stage | " + " | ".join(cols) + " |",
    "|---|" + "---|" * len(cols),
  ]
  for r in result["rows"]:
    lines.append(f"| {r['stage']} | " + " | ".join(f"{r[c]:.4g}" for c in cols) + " |")
  if "neuron_overlap" in result:
    o = result["neuron_overlap"]
    lines += [
      "",
      f"Top-changed MLP neurons of {o['stage']} (vs {o['base_stage']}, top {o['fraction']:g} "
      f"per layer) shared with {o['against']}: {o['overlap']:.3f} (unrelated sets: about "
      f"{o['fraction']:g}).",
    ]
  return "\n".join(lines) + "\n"


def domain_rows(ctx, config, env, examples: int) -> dict:
  """``examples`` gold rows of ``env`` at the level its evaluation uses."""
  level = context_lib._eval_level(config, env)  # pylint: disable=protected-access
  key = jax.random.fold_in(jax.random.key(config.seed), 7919)
  pairs = env.corpus(key, examples, level=level, noise=0.0)
  pairs = [(context_lib.prompt_text(ctx.tokenizer, p, ctx.chat_template), c) for p, c in pairs]
  rows = pretrain.tokenize_pairs(ctx.tokenizer, pairs, sft.sequence_length(ctx.tokenizer, pairs))
  return {k: jnp.asarray(v) for k, v in rows.items()}


def domains_table(workdir: str, stages, *, domains, examples: int = 128, **_) -> dict:
  """The multi-domain analysis (module docstring); written to ``workdir/analysis/domains.*``."""
  if not domains:
    raise ValueError("the domains analysis needs --domains ENV [ENV ...] (the envs to score)")
  config = stored_config(workdir)
  with config.unlocked():
    config.eval.extra_envs = tuple(domains)
  ctx = methods_lib.make_context(config, workdir, check_memory=False)
  rows = {d: domain_rows(ctx, config, ctx.extra_envs[d][0], examples) for d in domains}
  losses = {
    d: jax.jit(lambda p, r=r: plasticity.nll(ctx.graphdef, p, r["tokens"], r["loss_mask"]))
    for d, r in rows.items()
  }
  table, damages, prev = [], [], None
  for name in stages:
    params = experiment.load_final(workdir, name)[0]
    row = {"stage": name}
    for d in domains:
      metrics = ctx.make_evaluator(extra=d)(params, ctx.eval_key)
      row[f"accuracy/{d}"] = float(metrics["eval/extra_accuracy"])
      row[f"nll/{d}"] = float(losses[d](params))
    if prev is not None:
      for d in domains:
        dmg = interference.damage(losses[d], prev[1], params)
        before, after = prev[2][f"accuracy/{d}"], row[f"accuracy/{d}"]
        damages.append(
          {"stage": name, "after": prev[0], "domain": d, **dmg, "accuracy_change": after - before}
        )
    table.append(row)
    prev = (name, params, row)
  result = {
    "workdir": workdir,
    "examples": examples,
    "domains": list(domains),
    "rows": table,
    "damage": damages,
  }
  if len(damages) >= 3:
    rho = stats.spearmanr([x["predicted"] for x in damages], [x["measured"] for x in damages])
    result["spearman_predicted_measured"] = float(rho.statistic)
  folder = os.path.join(workdir, "analysis")
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, "domains.json"), "w", encoding="utf-8") as f:
    json.dump(result, f, indent=2, sort_keys=True)
  with open(os.path.join(folder, "domains.md"), "w", encoding="utf-8") as f:
    f.write(domains_markdown(result))
  return result


def domains_markdown(result: dict) -> str:
  ds = result["domains"]
  lines = [
    f"# Domains of {result['workdir']}",
    "",
    "Greedy accuracy after each stage:",
    "",
    "| stage | " + " | ".join(ds) + " |",
    "|---|" + "---|" * len(ds),
  ]
  for r in result["rows"]:
    lines.append(f"| {r['stage']} | " + " | ".join(f"{r[f'accuracy/{d}']:.3f}" for d in ds) + " |")
  lines += [
    "",
    f"Gold-row NLL ({result['examples']} rows a domain):",
    "",
    "| stage | " + " | ".join(ds) + " |",
    "|---|" + "---|" * len(ds),
  ]
  for r in result["rows"]:
    lines.append(f"| {r['stage']} | " + " | ".join(f"{r[f'nll/{d}']:.4f}" for d in ds) + " |")
  if result["damage"]:
    lines += [
      "",
      "Damage of each stage's update to each domain's NLL (predicted from the "
      "previous stage's parameters):",
      "",
      "| stage | domain | g·Δ | ½ΔᵀHΔ | predicted | measured | Δ accuracy |",
      "|---|---|---|---|---|---|---|",
    ]
    for x in result["damage"]:
      lines.append(
        f"| {x['stage']} | {x['domain']} | {x['first_order']:+.4f} | "
        f"{x['second_order']:+.4f} | {x['predicted']:+.4f} | {x['measured']:+.4f} | "
        f"{x['accuracy_change']:+.3f} |"
      )
  if "spearman_predicted_measured" in result:
    lines += [
      "",
      "Spearman rank correlation of predicted and measured damage: "
      f"{result['spearman_predicted_measured']:.3f}.",
    ]
  return "\n".join(lines) + "\n"


def collect(paths, title: str) -> str:
  """One markdown table over several runs' results of one analysis (``plasticity.json`` or
  ``domains.json``, e.g. one per seed): per stage, each column's mean over the runs and its
  per-run values; for ``domains``, the damage rows' Spearman correlation per run."""
  results = []
  for path in paths:
    with open(path, encoding="utf-8") as f:
      results.append(json.load(f))
  if not results:
    raise ValueError("collect needs at least one result file")
  stages = [r["stage"] for r in results[0]["rows"]]
  cols = [k for k in results[0]["rows"][0] if k != "stage"]
  lines = [
    f"# {title}",
    "",
    f"{len(results)} runs: " + ", ".join(f"`{os.path.relpath(p)}`" for p in paths) + ".",
    "Each cell: the mean over the runs, then the runs' values in that order.",
    "",
    "| stage | " + " | ".join(cols) + " |",
    "|---|" + "---|" * len(cols),
  ]
  for i, stage in enumerate(stages):
    cells = []
    for c in cols:
      vals = [r["rows"][i][c] for r in results]
      cells.append(f"{np.mean(vals):.4g} ({', '.join(f'{v:.3g}' for v in vals)})")
    lines.append(f"| {stage} | " + " | ".join(cells) + " |")
  rhos = [r["spearman_predicted_measured"] for r in results if "spearman_predicted_measured" in r]
  if rhos:
    lines += [
      "",
      "Spearman rank correlation of the predicted and measured damage (per run): "
      + ", ".join(f"{x:.3f}" for x in rhos)
      + f"; mean {np.nanmean(rhos):.3f}.",
    ]
  overlaps = [r["neuron_overlap"]["overlap"] for r in results if "neuron_overlap" in r]
  if overlaps:
    lines += [
      "",
      "Top-changed neuron overlap (per run): " + ", ".join(f"{x:.3f}" for x in overlaps),
    ]
  return "\n".join(lines) + "\n"


def render(name: str, result: dict) -> str:
  if name == "representations":
    return inside.markdown(result)
  return domains_markdown(result) if name == "domains" else markdown(result)


def _representations(workdir: str, stages, **kwargs) -> dict:
  return inside.representations_table(workdir, stages, config=stored_config(workdir), **kwargs)


ANALYSES = {
  "plasticity": plasticity_table,
  "domains": domains_table,
  "representations": _representations,
}

__all__ = [
  "ANALYSES",
  "collect",
  "domains_table",
  "gold_rows",
  "markdown",
  "plasticity_table",
  "render",
  "stored_config",
]
