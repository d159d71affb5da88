"""PR2, predictive routing replay (arXiv 2606.00395; methods_B.md section 3; docs/pr2.md).

R3 (``config.rl.routing_replay``) replays the experts the rollout's router chose, which go stale
as the router moves during off-policy updates. PR2 learns where the router is heading: a
low-rank predictor ``f_phi`` (objectives/route_prediction.py) of each MoE layer's router logits
``K = rl.pr2.horizon`` updates ahead. Rollouts route each token to ``TopK(g + f_phi(x))``
(``route_shift``: the predictor as a rank-r shift of the router matrix), the sampler records
those experts, and the update replays them exactly as R3 does (gates from the current router
on the recorded set). ``f_phi = 0`` is R3.

Its ``METHODS`` entry:

- ``init_state``: ``pr2`` (the predictor's train state, its own Adam) and ``pr2_cache`` (a ring
  of ``K`` cached batches: token rows, router inputs ``x`` and logits ``g`` recorded right
  after an update, and whether the slot is filled);
- ``route_shift``: the predictor's ``[L, D, E]`` shift for the step's rollouts;
- ``sampler_settings``: ``shift_gates`` (gates from the predicted logits, off by default);
- ``after_update``: the batch cached ``K`` steps ago gets its target, the router logits of the
  same tokens under the updated policy (``K`` updates after they were recorded); the predictor
  is scored on it (``pr2/pred_overlap`` against ``pr2/stale_overlap``: the top-k overlap of the
  predicted and of the unchanged logits with the target's) and fitted on it; then this step's
  rows are cached in its slot.

Metrics: ``pr2/drift`` (the loss of ``f_phi = 0``: how far the router moved), ``pr2/loss_before``
(held out: the predictor had not seen this target) and ``pr2/loss_after``, ``pr2/pred_overlap``,
``pr2/stale_overlap``.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from posttrain_jax.methods.pr2.fields import PR2
from posttrain_jax.objectives import route_prediction as rp
from posttrain_jax.registry import ConfigError
from posttrain_jax.train import hooks
from posttrain_jax.train import state as state_lib

SEED_OFFSET = 4000  # the predictor's initialisation seed: config.seed + this


def active(config) -> bool:
  return bool(config.rl.pr2.enabled)


def check(config) -> None:
  p = config.rl.pr2
  if not config.rl.routing_replay:
    raise ConfigError(
      "config.rl.pr2 replays the predicted routes in the update: set config.rl.routing_replay="
      "True (and use a mixture-of-experts model)"
    )
  if p.loss not in rp.LOSSES:
    raise ConfigError(f"config.rl.pr2.loss={p.loss!r} is not one of {list(rp.LOSSES)}")
  if config.rl.async_rollouts.enabled:
    raise ConfigError(
      "config.rl.pr2 routes the synchronous loop's rollouts; turn off config.rl.async_rollouts"
    )


class Built(NamedTuple):
  tx: optax.GradientTransformation
  capture: object  # (params, tokens [R, W+1], start [R]) -> (x [L, R, W, D], g [L, R, W, E])
  fit: object  # jitted rp.fit with the section's settings
  overlap: object  # (a, b [L, N, E], mask [N]) -> [] masked top-k overlap
  rows: int
  width: int  # W + 1 = S + T: a cached row's tokens


def build(ctx, init_params) -> Built:
  del init_params
  p = ctx.config.rl.pr2
  model_config = nnx.merge(ctx.graphdef, ctx.init_params).config
  k = model_config.num_experts_per_tok
  tx = optax.adam(float(p.lr))
  graphdef = ctx.graphdef

  def capture(params, tokens, start):
    model = nnx.merge(graphdef, params)
    out = model(tokens[:, :-1], start=start, return_router_inputs=True)
    x = out.router_inputs  # [L, R, W, D]
    g = jnp.einsum("lrwd,lde->lrwe", x, model.layers.router[...].astype(jnp.float32))
    return x, g

  def fit(pred, opt_state, x, g_old, g_new, mask):
    return rp.fit(pred, opt_state, tx, x, g_old, g_new, mask, steps=int(p.steps), kind=p.loss)

  def overlap(a, b, mask):
    _, ia = jax.lax.top_k(a, k)
    _, ib = jax.lax.top_k(b, k)
    hit = jnp.mean(jnp.any(ia[..., :, None] == ib[..., None, :], axis=-1), axis=-1)  # [L, N]
    return jnp.sum(jnp.mean(hit, axis=0) * mask) / jnp.maximum(jnp.sum(mask), 1.0)

  rows = min(int(p.rows), ctx.config.rl.prompts_per_step * ctx.config.rl.group_size)
  return Built(
    tx,
    jax.jit(capture),
    jax.jit(fit),
    jax.jit(overlap),
    rows,
    ctx.prompt_len + ctx.config.rl.max_new_tokens,
  )


def init_state(ctx, built: Built, init_params) -> dict:
  c = nnx.merge(ctx.graphdef, init_params).config
  p = ctx.config.rl.pr2
  L, D, E, K = c.num_layers, c.hidden_size, c.num_experts, int(p.horizon)
  R, W = built.rows, built.width - 1
  pred = rp.init(jax.random.key(ctx.config.seed + SEED_OFFSET), L, D, E, int(p.rank))
  cache = {
    "tokens": jnp.zeros((K, R, W + 1), jnp.int32),
    "start": jnp.zeros((K, R), jnp.int32),
    "mask": jnp.zeros((K, R * W), jnp.float32),
    "x": jnp.zeros((K, L, R * W, D), jnp.float32),
    "g": jnp.zeros((K, L, R * W, E), jnp.float32),
    "filled": jnp.zeros((K,), jnp.float32),
  }
  return {"pr2": state_lib.init_state(pred, built.tx), "pr2_cache": cache}


def route_shift(ctx, run, built: Built, state) -> jax.Array:
  del ctx, run, built
  return rp.shift(state["pr2"].params)


def sampler_settings(config) -> dict:
  return {"shift_gates": bool(config.rl.pr2.shift_gates)}


def _rows(built: Built, rows, pad_id: int):
  """The first ``built.rows`` rows of the step's rollouts at full width: tokens [R, S+T]
  (padded if trimmed), start [R], mask [R * W] (real prompt positions from ``start`` and
  completion tokens the trainer's forward reads, on valid rows)."""
  ro = rows.rollout
  R, width = built.rows, built.width
  tokens, start, cmask, valid = jax.device_get(
    (ro.tokens[:R], ro.start[:R], ro.completion_mask[:R], rows.valid[:R])
  )
  tokens, cmask = np.asarray(tokens), np.asarray(cmask)
  pad = width - tokens.shape[1]
  tokens = np.pad(tokens, ((0, 0), (0, pad)), constant_values=pad_id)
  cmask = np.pad(cmask, ((0, 0), (0, pad)))
  S = width - cmask.shape[1]
  position = np.arange(width - 1)[None, :]
  real = np.concatenate([position[:, :S] >= np.asarray(start)[:, None], cmask[:, :-1] > 0], axis=1)
  mask = (real & (np.asarray(valid)[:, None] > 0)).astype(np.float32).reshape(-1)
  return jnp.asarray(tokens), jnp.asarray(start, jnp.int32), jnp.asarray(mask)


def _flat(a: jax.Array) -> jax.Array:
  """[L, R, W, X] -> [L, R * W, X]."""
  return a.reshape(a.shape[0], -1, a.shape[-1])


def after_update(ctx, run, built: Built, state, record, step, scratch):
  """Target, score and fit on the batch cached ``K`` steps ago; cache this step's rows."""
  del record
  K = int(ctx.config.rl.pr2.horizon)
  slot = int(step) % K
  cache, pred_state = state["pr2_cache"], state["pr2"]
  params = run.fns.full(state["policy"].params)
  metrics = {}
  if float(cache["filled"][slot]) > 0:
    _, g_new = built.capture(params, cache["tokens"][slot], cache["start"][slot])
    x, g_old, mask = cache["x"][slot], cache["g"][slot], cache["mask"][slot]
    g_new = _flat(g_new)
    pred = rp.predicted_logits(pred_state.params, x, g_old)
    metrics["pr2/pred_overlap"] = built.overlap(pred, g_new, mask)
    metrics["pr2/stale_overlap"] = built.overlap(g_old, g_new, mask)
    params_p, opt_state, fit = built.fit(
      pred_state.params, pred_state.opt_state, x, g_old, g_new, mask
    )
    pred_state = state_lib.TrainState(pred_state.step + 1, params_p, opt_state)
    metrics.update({f"pr2/{k}": v for k, v in fit.items()})
  tokens, start, mask = _rows(built, scratch["rows"], ctx.tokenizer.pad_token_id)
  x, g = built.capture(params, tokens, start)
  cache = {
    "tokens": cache["tokens"].at[slot].set(tokens),
    "start": cache["start"].at[slot].set(start),
    "mask": cache["mask"].at[slot].set(mask),
    "x": cache["x"].at[slot].set(_flat(x)),
    "g": cache["g"].at[slot].set(_flat(g)),
    "filled": cache["filled"].at[slot].set(1.0),
  }
  metrics = {k: float(v) for k, v in metrics.items()}
  return {**state, "pr2": pred_state, "pr2_cache": cache}, metrics


METHOD = hooks.Method(
  name="pr2",
  section="rl.pr2",
  active=active,
  doc="docs/pr2.md",
  check=check,
  build=build,
  init_state=init_state,
  route_shift=route_shift,
  sampler_settings=sampler_settings,
  after_update=after_update,
  fields={"rl.pr2": PR2},
)

__all__ = ["METHOD", "route_shift"]
