"""``representations``: what a run's checkpoints hold inside, per layer (``scripts/analyze.py
representations WORKDIR --stages pretrain rl``).

On the run's first ``examples`` evaluation problems, for each listed stage's final parameters:
the hidden state at the last prompt token at every layer (analysis/representations.py), the
policy's greedy correctness per problem, and per layer

- ``lens_agree``: the share of problems whose logit-lens top token at that layer is the token
  the model emits first (the layer where the answer's first token is formed);
- ``cka_first``: linear CKA between this stage's states and the first listed stage's (how much
  training moved the representation);
- ``probe_auroc``: a correctness probe, the difference of means of the states of solved and
  unsolved problems on the even-indexed half, scored by projection on the odd half (AUROC,
  analysis/detection.py; NaN where a half lacks one class).

Writes ``WORKDIR/analysis/representations.{md,json,png}``.
"""

import json
import math
import os

import jax.numpy as jnp
import numpy as np
from flax import nnx

from posttrain_jax import io as ptio
from posttrain_jax import methods as methods_lib
from posttrain_jax import rollout
from posttrain_jax.analysis import detection
from posttrain_jax.analysis import representations as rep
from posttrain_jax.train import experiment

COLUMNS = ("lens_agree", "cka_first", "probe_auroc")


def _probe(states: np.ndarray, solved: np.ndarray) -> float:
  """AUROC on the odd half of a difference-of-means direction fitted on the even half."""
  fit, held = np.arange(len(solved)) % 2 == 0, np.arange(len(solved)) % 2 == 1
  if len(set(solved[fit])) < 2 or len(set(solved[held])) < 2:
    return math.nan
  v = rep.diff_of_means(
    jnp.asarray(states[fit][solved[fit]]), jnp.asarray(states[fit][~solved[fit]])
  )
  return detection.auroc(np.asarray(states[held] @ np.asarray(v)), solved[held].astype(int))


def stage_states(
  ctx, params, problems, capture, num_layers: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(states [L+1, N, D] at the last prompt token, lens-first-token agreement [L+1], solved [N])
  of ``params`` on ``problems``."""
  texts = ctx.prompt_texts(problems)
  tokens, mask = rollout.encode_prompts(ctx.tokenizer, texts, length=ctx.prompt_len)
  tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)
  start = (tokens.shape[1] - jnp.sum(mask, axis=1)).astype(jnp.int32)
  L = num_layers
  positions = rep.last_positions(np.asarray(start), tokens.shape[1])
  states = capture(params, tokens, start, tuple(range(L + 1)), positions)[:, :, 0]  # [L+1, N, D]
  lens = rep.logit_lens(ctx.graphdef, params, states)  # [L+1, N, V]
  top = np.asarray(jnp.argmax(lens, axis=-1))
  agree = (top == top[-1][None]).mean(axis=1)
  solved = ctx.make_evaluator(len(problems)).scores(params, problems, ctx.eval_key) > 0.5
  return np.asarray(states), agree, solved


def representations_table(workdir: str, stages, *, config, examples: int = 256, **_) -> dict:
  """The ``representations`` analysis (module docstring) of the run in ``workdir`` made with
  ``config`` (its stored config.json)."""
  ctx = methods_lib.make_context(config, workdir, check_memory=False)
  problems = ctx.eval_problems[:examples]
  if len(problems) < 4:
    raise ValueError(f"the run has {len(problems)} evaluation problems; the probe needs >= 4")
  num_layers = nnx.merge(ctx.graphdef, ctx.init_params).config.num_layers
  capture = rep.make_capture(ctx.graphdef)
  rows, first = [], None
  for name in stages:
    params = experiment.load_final(workdir, name)[0]
    states, agree, solved = stage_states(ctx, params, problems, capture, num_layers)
    first = states if first is None else first
    for layer in range(states.shape[0]):
      rows.append(
        {
          "stage": name,
          "layer": layer,
          "accuracy": float(solved.mean()),
          "lens_agree": float(agree[layer]),
          "cka_first": float(rep.linear_cka(jnp.asarray(first[layer]), jnp.asarray(states[layer]))),
          "probe_auroc": _probe(states[layer], solved),
        }
      )
  result = {"workdir": workdir, "examples": len(problems), "stages": list(stages), "rows": rows}
  folder = os.path.join(workdir, "analysis")
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, "representations.json"), "w", encoding="utf-8") as f:
    json.dump(result, f, indent=2, sort_keys=True)
  with open(os.path.join(folder, "representations.md"), "w", encoding="utf-8") as f:
    f.write(markdown(result))
  _plot(result, os.path.join(folder, "representations.png"))
  return result


def markdown(result: dict) -> str:
  header = ["stage", "layer", "greedy accuracy", *COLUMNS]
  rows = [
    [r["stage"], r["layer"], f"{r['accuracy']:.3f}", *(f"{r[c]:.3f}" for c in COLUMNS)]
    for r in result["rows"]
  ]
  return (
    f"# Inside {result['workdir']} ({result['examples']} evaluation problems, last prompt "
    "token; layer 0 = embeddings)\n\n" + ptio.format_table(header, rows) + "\n"
  )


def _plot(result: dict, path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, len(COLUMNS), figsize=(4 * len(COLUMNS), 3.2))
  for ax, col in zip(axes, COLUMNS):
    for stage in result["stages"]:
      pts = [(r["layer"], r[col]) for r in result["rows"] if r["stage"] == stage]
      ax.plot(*zip(*pts), marker="o", label=stage)
    ax.set_title(col)
    ax.set_xlabel("layer")
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
