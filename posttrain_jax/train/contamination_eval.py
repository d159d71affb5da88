"""LaRA in the eval stage (``config.eval.lara_seen``; analysis/contamination.py for the math):
were these items trained on? Detection of a known set of trained-on items against never-seen
ones, by LaRA's layer-wise metrics and by output-level baselines.

Three JSONL files of problems (any layout ``envs.StaticDataset`` reads): ``lara_seen`` (items the
run trained on), ``lara_unseen`` (items it never saw) and ``lara_reference`` (other never-seen
items: the clean reference each metric is standardised against). For every item and the env's
``variants(problem) -> (information-removed prompt, [paraphrases])``, the hidden states at the
last prompt token at every block's output (layers 1..L) give RSM, DC and RSI; the item's LaRA
score is their standardised mean. The baselines read the policy's log-probs of the item's
reference answer (and EOS) after its prompt: mean log-likelihood, Min-K% (k = 0.2) and minus the
mean entropy.

Returns ``{f"{detector}_auroc": ..., f"{detector}_tpr5": ...}`` for detector in lara / loglik /
min_k / neg_entropy (seen = positive), and ``lara_auroc_minus_best_baseline``.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posttrain_jax import objectives, rollout
from posttrain_jax.analysis import contamination, detection
from posttrain_jax.analysis import representations as rep
from posttrain_jax.envs import static
from posttrain_jax.registry import ConfigError
from posttrain_jax.train import updates

DETECTORS = ("lara", "loglik", "min_k", "neg_entropy")


def load_items(path: str) -> list:
  """The problems of a LaRA item file, in file order (its split marks are ignored)."""
  return list(static.StaticDataset(path).problems)


def _states(ctx, params, capture, prompts: list[str], num_layers: int) -> np.ndarray:
  """[N, L, D] block outputs at the last prompt token."""
  tokens, mask = rollout.encode_prompts(ctx.tokenizer, prompts, length=ctx.prompt_len)
  tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)
  start = (tokens.shape[1] - jnp.sum(mask, axis=1)).astype(jnp.int32)
  positions = rep.last_positions(np.asarray(start), tokens.shape[1])
  states = capture(params, tokens, start, tuple(range(1, num_layers + 1)), positions)
  return np.swapaxes(np.asarray(states[:, :, 0]), 0, 1)


def features(ctx, params, problems, capture, num_layers: int) -> np.ndarray:
  """[N, 3, L] LaRA's metrics of each item."""
  if not hasattr(ctx.env, "variants"):
    raise ConfigError(
      f"config.eval.lara_seen: env {ctx.config.env.name!r} has no variants(problem) (the "
      "information-removed and paraphrased prompts LaRA perturbs with); arithmetic has them"
    )
  removed, paras = zip(*(ctx.env.variants(p) for p in problems))
  J = len(paras[0])
  h = _states(ctx, params, capture, [p.prompt for p in problems], num_layers)
  h_rm = _states(ctx, params, capture, list(removed), num_layers)
  h_para = _states(ctx, params, capture, [q for ps in paras for q in ps], num_layers)
  h_para = h_para.reshape(len(problems), J, *h.shape[1:])
  fn = jax.vmap(contamination.metrics)
  return np.asarray(fn(jnp.asarray(h), jnp.asarray(h_para), jnp.asarray(h_rm)))


def baselines(ctx, params, problems) -> dict:
  """The output-level scores of each item's reference answer (``contamination.output_baselines``)."""
  tok = ctx.tokenizer
  S = ctx.prompt_len
  answers = [
    tok([p.answer], add_special_tokens=False)["input_ids"][0] + [tok.eos_token_id] for p in problems
  ]
  T = max(len(a) for a in answers)
  tokens, pmask = rollout.encode_prompts(tok, [p.prompt for p in problems], length=S)
  completion = np.full((len(problems), T), tok.pad_token_id, np.int32)
  cmask = np.zeros((len(problems), T), np.float32)
  for i, a in enumerate(answers):
    completion[i, : len(a)], cmask[i, : len(a)] = a, 1.0
  full = jnp.concatenate([jnp.asarray(tokens), jnp.asarray(completion)], axis=1)
  start = jnp.asarray(S - np.asarray(pmask).sum(axis=1), jnp.int32)
  logprobs, logits = updates.sequence_logprobs(ctx.graphdef, params, full, start, S)
  entropy = objectives.token_entropy(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1))
  out = contamination.output_baselines(logprobs, entropy, jnp.asarray(cmask))
  return {k: np.asarray(v) for k, v in out.items()}


def evaluate(ctx, params, *, seen: str, unseen: str, reference: str) -> dict:
  """LaRA and the baselines on ``params`` (module docstring)."""
  items = {
    name: load_items(path)
    for name, path in (("seen", seen), ("unseen", unseen), ("reference", reference))
  }
  num_layers = nnx.merge(ctx.graphdef, params).config.num_layers
  capture = rep.make_capture(ctx.graphdef)
  feats = {k: features(ctx, params, v, capture, num_layers) for k, v in items.items()}
  labels = np.concatenate([np.ones(len(items["seen"])), np.zeros(len(items["unseen"]))])
  scores = {
    "lara": np.asarray(
      contamination.lara_scores(
        jnp.asarray(np.concatenate([feats["seen"], feats["unseen"]])),
        jnp.asarray(feats["reference"]),
      )
    )
  }
  base = {k: baselines(ctx, params, items[k]) for k in ("seen", "unseen")}
  for name in DETECTORS[1:]:
    scores[name] = np.concatenate([base["seen"][name], base["unseen"][name]])
  out = {}
  for name in DETECTORS:
    out[f"{name}_auroc"] = detection.auroc(scores[name], labels)
    out[f"{name}_tpr5"] = detection.tpr_at_fpr(scores[name], labels, 0.05)
  out["lara_auroc_minus_best_baseline"] = out["lara_auroc"] - max(
    out[f"{n}_auroc"] for n in DETECTORS[1:]
  )
  return out
