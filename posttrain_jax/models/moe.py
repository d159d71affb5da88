"""Sparse mixture-of-experts MLP (Qwen3-MoE / Mixtral / Qwen2-MoE), with routing record/replay.

Per layer, at each token with normalised residual ``x`` [D]:

* router logits ``g = x W_r`` [E] (float32), probabilities ``p = softmax(g)``;
* route ``S = TopK(p)`` [k] int32, or, under replay, the recorded ``S`` (R3, Ma et al. 2025,
  arXiv 2510.11370), or, with a selection shift ``M`` [D, E] (PR2's predicted router,
  methods/pr2/), ``S = TopK(g + x M)`` (the shift only picks the experts; the gates stay the
  router's unless ``shift_gates``);
* gate weights ``w_j = p[S_j]``, divided by ``sum_j p[S_j]`` when ``norm_topk_prob`` (then
  ``w = softmax(g[S])``, the softmax over the k routed logits: Mixtral always, Qwen3-MoE as its
  config says). Replay uses the same formula on the recorded ``S``, so the gates come from the
  *current* router and the router gets gradient through them; replaying the model's own route
  reproduces its output exactly;
* ``y = sum_j w_j E_{S_j}(x)`` with ``E_e(x) = (silu(x G_e) * (x U_e)) D_e`` (SwiGLU experts),
  plus, with a shared expert (Qwen2-MoE), ``sigmoid(x w_s) * E_shared(x)``.

Experts are computed densely: every expert runs on every token and a combine weight
``c[b, t, e] = sum_j w_j [S_j = e]`` (zero off the route) mixes them. That is exact, static-shape
and scan/jit friendly, and gradients reach only routed experts (``c`` is zero elsewhere), but it
costs E/k times the FLOPs of a sparse dispatch and holds a ``[B, T, E, F]`` activation; fine for
the small models this library trains on CPU, a token-dropping / grouped-matmul dispatch would be
the change for large E.

Load-balancing loss (Switch Transformer eqs. 4-6, as Hugging Face's ``load_balancing_loss_func``
computes it for Mixtral / Qwen-MoE): pooled over the ``L`` layers and the ``N`` real tokens,

  ``f_e = (1 / (L N)) sum_{l, n} [e in S_{l,n}]``,  ``P_e = (1 / (L N)) sum_{l, n} p_{l,n,e}``,
  ``aux = E * sum_e f_e P_e``

(``sum_e f_e = k``; a uniform router gives ``aux = k``). ``f`` counts the routes used (the
replayed ones under replay) and carries no gradient; ``P`` does. It is pooled over layers, not
a mean of per-layer losses, exactly as Hugging Face, and is not additive over micro-batches.

Routing arrays are ``[L, B, T, k]`` int32 (layer first, as the scan produces them). A row whose
recorded ids are not all in ``[0, E)`` (e.g. ``-1`` padding) is routed by the current router.

Shapes: ``B`` batch, ``T`` tokens, ``D`` width, ``E`` experts, ``k`` experts per token, ``F``
expert width, ``Fs`` shared-expert width, ``L`` layers.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from posttrain_jax.models.config import ModelConfig
from posttrain_jax.models.ops import dense

# Stacked parameter names of an MoE layer, in creation order (after the attention parameters).
EXPERT_PARAMS = ("router", "experts_gate", "experts_up", "experts_down")
SHARED_PARAMS = ("shared_gate", "shared_up", "shared_down", "shared_expert_gate")
PARAM_NAMES = EXPERT_PARAMS + SHARED_PARAMS


def _fan_in(in_axis, out_axis, batch_axis):
  return jax.nn.initializers.variance_scaling(
    1.0, "fan_in", "truncated_normal", in_axis=in_axis, out_axis=out_axis, batch_axis=batch_axis
  )


def param_specs(config: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple, object]]:
  """name -> (shape, logical axis names, initializer) of the stacked MoE parameters.

  ``expert`` is the logical axis of the expert dimension (a rule table maps it to a mesh axis
  for expert parallelism; unmapped it is replicated).
  """
  c = config
  L, D, E, F, Fs = (
    c.num_layers,
    c.hidden_size,
    c.num_experts,
    c.expert_dim,
    c.shared_expert_intermediate_size,
  )
  specs = {
    "router": ((L, D, E), ("layers", "embed", None), _fan_in(1, 2, 0)),
    "experts_gate": ((L, E, D, F), ("layers", "expert", "embed", "mlp"), _fan_in(2, 3, (0, 1))),
    "experts_up": ((L, E, D, F), ("layers", "expert", "embed", "mlp"), _fan_in(2, 3, (0, 1))),
    "experts_down": ((L, E, F, D), ("layers", "expert", "mlp", "embed"), _fan_in(2, 3, (0, 1))),
  }
  if Fs:
    specs.update(
      {
        "shared_gate": ((L, D, Fs), ("layers", "embed", "mlp"), _fan_in(1, 2, 0)),
        "shared_up": ((L, D, Fs), ("layers", "embed", "mlp"), _fan_in(1, 2, 0)),
        "shared_down": ((L, Fs, D), ("layers", "mlp", "embed"), _fan_in(1, 2, 0)),
        "shared_expert_gate": ((L, D, 1), ("layers", "embed", None), _fan_in(1, 2, 0)),
      }
    )
  return specs


class Route(NamedTuple):
  """One layer's routing: ``experts`` [B, T, k] int32, ``gates`` [B, T, k] float32 (the weights
  of those experts), ``probs`` [B, T, E] float32 (the full router softmax)."""

  experts: jax.Array
  gates: jax.Array
  probs: jax.Array


def route(
  x: jax.Array,
  router: jax.Array,
  *,
  top_k: int,
  norm_topk_prob: bool,
  replay: jax.Array | None = None,
  shift: jax.Array | None = None,
  shift_gates: bool = False,
) -> Route:
  """Routes tokens ``x`` [B, T, D] with router weights ``router`` [D, E].

  Args:
    x: [B, T, D] normalised residual stream.
    router: [D, E] router weights; logits are computed in float32.
    top_k: k.
    norm_topk_prob: renormalise the k gate weights to sum to one.
    replay: [B, T, k] int32 recorded experts to use instead of the top-k (rows with an id
      outside [0, E) use the top-k); gates are still computed from this router's logits.
    shift: [D, E] selection shift: the experts are ``TopK(g + x shift)`` (no gradient through
      the choice), the gates ``softmax(g[S])`` of the unshifted logits, or of the shifted ones
      with ``shift_gates``. Replayed rows keep their recorded experts.
    shift_gates: gates from the shifted logits (PR2's flag, methods_B.md section 3).

  Returns:
    Route(experts [B, T, k], gates [B, T, k], probs [B, T, E]).
  """
  E = router.shape[-1]
  logits = jnp.einsum("btd,de->bte", x.astype(jnp.float32), router.astype(jnp.float32))
  if shift is not None:
    shifted = logits + jnp.einsum("btd,de->bte", x.astype(jnp.float32), shift.astype(jnp.float32))
    select = jax.lax.stop_gradient(jax.nn.softmax(shifted, axis=-1))
    logits = shifted if shift_gates else logits
  probs = jax.nn.softmax(logits, axis=-1)
  select = jax.lax.stop_gradient(probs) if shift is None else select
  _, experts = jax.lax.top_k(select, top_k)
  experts = experts.astype(jnp.int32)
  if replay is not None:
    if replay.shape != experts.shape:
      raise ValueError(f"replayed routing has shape {replay.shape}, expected {experts.shape}")
    replay = replay.astype(jnp.int32)
    valid = jnp.all((replay >= 0) & (replay < E), axis=-1, keepdims=True)
    experts = jnp.where(valid, replay, experts)
  gates = jnp.take_along_axis(probs, experts, axis=-1)
  if norm_topk_prob:
    gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
  return Route(experts, gates, probs)


def combine_weights(r: Route, num_experts: int) -> jax.Array:
  """[B, T, E] float32: ``c[b, t, e] = sum_j gates[b, t, j] * [experts[b, t, j] = e]``."""
  onehot = jax.nn.one_hot(r.experts, num_experts, dtype=jnp.float32)  # [B, T, k, E]
  return jnp.einsum("btk,btke->bte", r.gates, onehot)


def _swiglu(x, gate, up, down):
  return dense(jax.nn.silu(dense(x, gate)) * dense(x, up), down)


class LayerStats(NamedTuple):
  """Per-layer sums for the load-balancing loss: ``counts`` [E] (masked routes to each expert),
  ``prob_sums`` [E] (masked router probabilities), ``rows`` [] (masked tokens)."""

  counts: jax.Array
  prob_sums: jax.Array
  rows: jax.Array


def moe_mlp(
  config: ModelConfig,
  p: dict,
  x: jax.Array,
  *,
  mask: jax.Array,
  replay: jax.Array | None = None,
  shift: jax.Array | None = None,
  shift_gates: bool = False,
) -> tuple[jax.Array, jax.Array, LayerStats]:
  """The sparse MLP of one layer.

  Args:
    config: the model config (num_experts > 0).
    p: this layer's parameters: 'router' [D, E], 'experts_gate'/'experts_up' [E, D, F],
      'experts_down' [E, F, D], and with a shared expert 'shared_gate'/'shared_up' [D, Fs],
      'shared_down' [Fs, D], 'shared_expert_gate' [D, 1].
    x: [B, T, D] the normalised residual stream (compute dtype).
    mask: [B, T] float32, 1 on tokens counted by the load-balancing loss.
    replay: [B, T, k] int32 recorded experts, or None (route by top-k).
    shift: [D, E] selection shift (:func:`route`), or None; ``shift_gates``: gates from it.

  Returns:
    (y [B, T, D] in x.dtype, experts used [B, T, k] int32, LayerStats).
  """
  c = config
  r = route(
    x,
    p["router"],
    top_k=c.num_experts_per_tok,
    norm_topk_prob=c.norm_topk_prob,
    replay=replay,
    shift=shift,
    shift_gates=shift_gates,
  )
  combine = combine_weights(r, c.num_experts).astype(x.dtype)  # [B, T, E]
  gate = jnp.einsum("btd,edf->btef", x, p["experts_gate"])
  up = jnp.einsum("btd,edf->btef", x, p["experts_up"])
  act = jax.nn.silu(gate) * up * combine[..., None]  # [B, T, E, F]
  y = jnp.einsum("btef,efd->btd", act, p["experts_down"])
  if "shared_gate" in p:
    shared = _swiglu(x, p["shared_gate"], p["shared_up"], p["shared_down"])
    y = y + jax.nn.sigmoid(jnp.einsum("btd,do->bto", x, p["shared_expert_gate"])) * shared
  onehot = jax.nn.one_hot(r.experts, c.num_experts, dtype=jnp.float32)
  stats = LayerStats(
    counts=jnp.einsum("bt,btke->e", mask, onehot),
    prob_sums=jnp.einsum("bt,bte->e", mask, r.probs),
    rows=jnp.sum(mask),
  )
  return y.astype(x.dtype), r.experts, stats


def load_balancing_loss(stats: LayerStats) -> jax.Array:
  """Switch / Mixtral load-balancing loss from the layers' stacked stats (leading axis L).

  ``aux = E * sum_e f_e P_e`` with ``f = sum_l counts_l / R``, ``P = sum_l prob_sums_l / R`` and
  ``R = sum_l rows_l`` (Hugging Face's ``load_balancing_loss_func``, attention-mask weighted).
  Returns a float32 scalar.
  """
  rows = jnp.maximum(jnp.sum(stats.rows), 1.0)
  f = jnp.sum(stats.counts, axis=0) / rows
  P = jnp.sum(stats.prob_sums, axis=0) / rows
  return f.shape[-1] * jnp.sum(jax.lax.stop_gradient(f) * P)


def routing_overlap(recorded: jax.Array, current: jax.Array) -> jax.Array:
  """``|S_rec ∩ S_cur| / k`` per (layer, token): ``[..., k], [..., k] int -> [...]`` float32.

  The routing-staleness diagnostic of routing replay (PR2): how many of the recorded experts
  the current router would still pick (1 = the same set).
  """
  hit = jnp.any(recorded[..., :, None] == current[..., None, :], axis=-1)
  return jnp.mean(hit.astype(jnp.float32), axis=-1)


def check_routing(config: ModelConfig, routing: jax.Array | None, batch: int, length: int):
  """Raises unless ``routing`` is None or [L, B, T, k] for a mixture of experts."""
  if routing is None:
    return
  want = (config.num_layers, batch, length, config.num_experts_per_tok)
  if not config.num_experts:
    raise ValueError("routing replay needs a mixture-of-experts model (num_experts > 0)")
  if tuple(routing.shape) != want:
    raise ValueError(
      f"routing has shape {tuple(routing.shape)}, expected [L, B, T, k] = {list(want)}"
    )


def check_shift(config: ModelConfig, shift: jax.Array | None):
  """Raises unless ``shift`` is None or [L, D, E] for a mixture of experts."""
  if shift is None:
    return
  want = (config.num_layers, config.hidden_size, config.num_experts)
  if not config.num_experts:
    raise ValueError("a routing shift needs a mixture-of-experts model (num_experts > 0)")
  if tuple(shift.shape) != want:
    raise ValueError(
      f"route_shift has shape {tuple(shift.shape)}, expected [L, D, E] = {list(want)}"
    )


def model_outputs(extra: tuple | None, return_routing: bool):
  """(aux_loss, routing, router inputs) of a forward from its layers' stacked MoE extras
  (experts [L, B, T, k], stacked LayerStats, router inputs [L, B, T, D] or None), or
  (None, None, None) for a dense model (``extra`` None); routing only when asked."""
  if extra is None:
    return None, None, None
  used, stats, inputs = extra
  return load_balancing_loss(stats), used if return_routing else None, inputs
