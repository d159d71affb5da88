"""The functional-welfare axis in the eval stage (``config.eval.welfare``, env ``welfare``;
arXiv 2605.30232, methods_B.md section 8): do the maze's rewarded and punished tiles get
antiparallel concept vectors after RL, aligned with a valence direction the model had before it
ever saw the maze?

At block ``layer`` (``config.eval.welfare_layer``, 1..L) and the prompt's last token:

- the valence direction ``e = mean(h | WIN) - mean(h | FAIL)`` of the maze-naive model (the
  evaluated stage's start) on ``n`` corpus episodes of each outcome;
- concept vectors by difference of means over the maze's views, off-policy (the views are
  built, not sampled): ``v_gold = mean(h | a Gold tile) - mean(h | Path tiles only)`` and
  ``v_mold`` likewise, from the RL-trained policy; ``u_gold``, ``u_mold`` the same from the
  maze-naive model (the control vectors);
- steering: the maze-naive model on corpus episodes with ``alpha * v / ||v||`` added at the
  layer; the change of its mean ``log p(W) - log p(F)`` at the outcome's first token.

Returns ``welfare_cos_v`` = cos(v_mold, v_gold), ``welfare_cos_u`` (the control's),
``welfare_align_{v,u}_{gold,mold}`` = cos(vector, e), ``welfare_align_gain_gold`` =
align_v_gold - align_u_gold, ``welfare_steer_{gold,mold}`` (the logit-gap change). Over RL: :func:`tracker` measures the
vectors and their alignment at every periodic RL evaluation (methods/welfare/), so a table can
show when, and whether, the alignment forms (``rl_*/welfare/align_gold`` summaries).
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posttrain_jax import rollout
from posttrain_jax.analysis import representations as rep
from posttrain_jax.envs import base
from posttrain_jax.envs import welfare as welfare_env


def _states(ctx, params, capture, prompts, layer: int) -> np.ndarray:
  """[N, D] the block ``layer`` output at each prompt's last token."""
  tokens, mask = rollout.encode_prompts(ctx.tokenizer, prompts, length=ctx.prompt_len)
  tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)
  start = (tokens.shape[1] - jnp.sum(mask, axis=1)).astype(jnp.int32)
  positions = rep.last_positions(np.asarray(start), tokens.shape[1])
  return np.asarray(capture(params, tokens, start, (layer,), positions)[0, :, 0])


def episodes(ctx, n: int) -> tuple[list[str], list[str]]:
  """``n`` WIN and ``n`` FAIL corpus prompts (the evaluation seed's draw)."""
  rng = base.numpy_rng(jax.random.fold_in(ctx.eval_key, 8191))
  wins = [welfare_env.episode(rng, win=True)[0] for _ in range(n)]
  fails = [welfare_env.episode(rng, win=False)[0] for _ in range(n)]
  return wins, fails


def views(level: int) -> dict:
  """The maze views by what they hold: ``gold`` (one Gold, three Path), ``mold`` and ``path``
  (four Path), each at every position."""
  P, G, M = welfare_env.PATH, welfare_env.GOLD, welfare_env.MOLD
  one = lambda k: [
    welfare_env.view([k if i == j else P for i in range(4)], level) for j in range(4)
  ]
  return {"gold": one(G), "mold": one(M), "path": [welfare_env.view([P] * 4, level)]}


def concept_vectors(ctx, params, capture, layer: int, level: int) -> dict:
  h = {k: _states(ctx, params, capture, v, layer) for k, v in views(level).items()}
  path = h["path"].mean(axis=0)
  return {k: h[k].mean(axis=0) - path for k in ("gold", "mold")}


def _cos(a, b) -> float:
  return float(rep.cosine(jnp.asarray(a), jnp.asarray(b)))


def logit_gap(ctx, params, prompts, steer=None) -> float:
  """Mean ``log p(W) - log p(F)`` at the first outcome token after each prompt."""
  tok = ctx.tokenizer
  win, fail = (tok.convert_tokens_to_ids(c) for c in ("W", "F"))
  tokens, mask = rollout.encode_prompts(tok, prompts, length=ctx.prompt_len)
  tokens = jnp.asarray(tokens)
  start = jnp.asarray(tokens.shape[1] - np.asarray(mask).sum(axis=1), jnp.int32)
  model = nnx.merge(ctx.graphdef, params)
  logits = model(tokens, start=start, steer=steer).logits[:, -1].astype(jnp.float32)
  logp = jax.nn.log_softmax(logits, axis=-1)
  return float(jnp.mean(logp[:, win] - logp[:, fail]))


def _check_layer(ctx, params, layer: int) -> int:
  num_layers = nnx.merge(ctx.graphdef, params).config.num_layers
  if not 1 <= layer <= num_layers:
    raise ValueError(
      f"config.eval.welfare_layer={layer} is not a block of the model (1..{num_layers})"
    )
  return num_layers


def valence(ctx, params, capture, layer: int, n: int) -> np.ndarray:
  """``e = mean(h | WIN) - mean(h | FAIL)`` of ``params`` on ``n`` corpus episodes each."""
  wins, fails = episodes(ctx, n)
  return _states(ctx, params, capture, wins, layer).mean(0) - _states(
    ctx, params, capture, fails, layer
  ).mean(0)


def tracker(ctx, start, *, layer: int, n: int):
  """``(params, key) -> metrics``: the welfare axis of ``params`` against the valence
  direction of ``start`` (the maze-naive RL start), for the RL stage's periodic evaluation:
  ``welfare/cos`` = cos(v_mold, v_gold), ``welfare/align_{gold,mold}`` = cos(v, e). At the
  start they equal the eval stage's ``welfare_cos_u`` and ``welfare_align_u_*``, after the
  last step its ``welfare_cos_v`` and ``welfare_align_v_*``."""
  _check_layer(ctx, start, layer)
  level = int(ctx.config.env.level)
  capture = rep.make_capture(ctx.graphdef)
  e = valence(ctx, start, capture, layer, n)

  def measure(params, key) -> dict:
    del key  # the views are built, not sampled
    v = concept_vectors(ctx, params, capture, layer, level)
    return {
      "welfare/cos": _cos(v["mold"], v["gold"]),
      "welfare/align_gold": _cos(v["gold"], e),
      "welfare/align_mold": _cos(v["mold"], e),
    }

  return measure


def evaluate(ctx, before, after, *, layer: int, n: int, alpha: float) -> dict:
  """The welfare-axis measures (module docstring) of ``after`` (RL-trained) against ``before``
  (its maze-naive start)."""
  num_layers = _check_layer(ctx, before, layer)
  level = int(ctx.config.env.level)
  capture = rep.make_capture(ctx.graphdef)
  wins, fails = episodes(ctx, n)
  e = valence(ctx, before, capture, layer, n)
  v = concept_vectors(ctx, after, capture, layer, level)
  u = concept_vectors(ctx, before, capture, layer, level)
  out = {"welfare_cos_v": _cos(v["mold"], v["gold"]), "welfare_cos_u": _cos(u["mold"], u["gold"])}
  for name, vecs in (("v", v), ("u", u)):
    for kind in ("gold", "mold"):
      out[f"welfare_align_{name}_{kind}"] = _cos(vecs[kind], e)
  out["welfare_align_gain_gold"] = out["welfare_align_v_gold"] - out["welfare_align_u_gold"]
  prompts = wins + fails
  base_gap = logit_gap(ctx, before, prompts)
  for kind in ("gold", "mold"):
    direction = jnp.asarray(v[kind]) / max(float(np.linalg.norm(v[kind])), 1e-12)
    steer = rep.steering(num_layers, layer, direction, alpha)
    out[f"welfare_steer_{kind}"] = logit_gap(ctx, before, prompts, steer) - base_gap
  return out
