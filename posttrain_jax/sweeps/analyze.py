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
"""

import json
import os

import jax.numpy as jnp
import ml_collections

from posttrain_jax import methods as methods_lib
from posttrain_jax.analysis import plasticity
from posttrain_jax.modelops import neurons
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


ANALYSES = {"plasticity": plasticity_table}

__all__ = ["ANALYSES", "gold_rows", "markdown", "plasticity_table", "stored_config"]
