"""Plasticity diagnostics of a checkpoint on supervised rows (Rejuvenation, methods_A.md
section 4): over-confidence, SAM-style sharpness, and gradient cosines between two losses or
two checkpoints, overall and per module.

Every function reads a decoder (``graphdef``, ``params``) and rows ``tokens`` [B, L] int32 with
``loss_mask`` [B, L] aligned with them (1 on the completion and EOS: ``train.pretrain.
tokenize_pairs``' layout; the first token is never predicted). The loss is the mean negative
log-likelihood over the masked positions.

- :func:`confidence`: the mean max-probability and the mean entropy (nats) of the next-token
  distribution at the masked positions (an over-trained SFT model is sharply peaked: max-prob
  near 1, entropy near 0).
- :func:`sharpness`: ``L(theta + eps) - L(theta)`` with ``eps = rho g / ||g||`` (one ascent step,
  SAM's first-order solution of ``max_{||eps|| <= rho} L(theta + eps)``; derived as written in
  methods_A.md section 4).
- :func:`cosines`: the cosine of two gradients (pytrees) overall and per module (the leaf path
  with the layer stack's index left out, e.g. ``layers/gate``).
- :func:`dormancy_scores`: ReDo's dormancy ``s_u = E|h_u| / mean_v E|h_v|`` of every MLP neuron
  (its SwiGLU activation, per layer) over the real tokens of ``tokens``; the dormant neurons
  (``s_u < tau``, methods_A.md section 4) are the ones a reset by dormancy picks:
  ``modelops.neurons.reset_neurons(..., scores=-dormancy_scores(...))``.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from posttrain_jax import models
from posttrain_jax.models import ops
from posttrain_jax.models import transformer as tf


def _forward(graphdef, params, tokens):
  return nnx.merge(graphdef, params)(tokens[:, :-1]).logits.astype(jnp.float32)


def nll(graphdef, params, tokens, loss_mask) -> jax.Array:
  """The mean negative log-likelihood of the masked tokens."""
  logits = _forward(graphdef, params, tokens)
  lp = models.gather_logprobs(logits, tokens[:, 1:])
  m = loss_mask[:, 1:].astype(jnp.float32)
  return -jnp.sum(lp * m) / jnp.maximum(jnp.sum(m), 1.0)


def confidence(graphdef, params, tokens, loss_mask) -> dict:
  """``{"max_prob", "entropy"}``: means over the masked positions of the next-token
  distribution's largest probability and its entropy."""
  logp = jax.nn.log_softmax(_forward(graphdef, params, tokens), axis=-1)
  p = jnp.exp(logp)
  m = loss_mask[:, 1:].astype(jnp.float32)
  n = jnp.maximum(jnp.sum(m), 1.0)
  entropy = -jnp.sum(p * logp, axis=-1)
  return {
    "max_prob": jnp.sum(jnp.max(p, axis=-1) * m) / n,
    "entropy": jnp.sum(entropy * m) / n,
  }


def grad(graphdef, params, tokens, loss_mask):
  """The gradient of :func:`nll` with respect to ``params``."""
  return jax.grad(lambda p: nll(graphdef, p, tokens, loss_mask))(params)


def global_norm(tree) -> jax.Array:
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)))


def sharpness(graphdef, params, tokens, loss_mask, rho: float = 0.05) -> dict:
  """``{"loss", "sharpness"}``: the loss and ``L(theta + rho g/||g||) - L(theta)``."""
  if rho <= 0:
    raise ValueError(f"sharpness needs a radius rho > 0, got {rho}")
  loss, g = jax.value_and_grad(lambda p: nll(graphdef, p, tokens, loss_mask))(params)
  scale = rho / jnp.maximum(global_norm(g), 1e-12)
  moved = jax.tree.map(lambda x, d: (x.astype(jnp.float32) + scale * d).astype(x.dtype), params, g)
  return {"loss": loss, "sharpness": nll(graphdef, moved, tokens, loss_mask) - loss}


def module_name(path) -> str:
  """A leaf's module: its path's names joined by ``/`` (``layers/gate``, ``embed/embedding``)."""
  parts = []
  for k in path:
    name = getattr(k, "key", getattr(k, "name", None))
    if name is not None and not isinstance(name, int):
      parts.append(str(name))
  return "/".join(p for p in parts if p != "value")


def cosines(a, b) -> dict:
  """``{"all": cos, "<module>": cos, ...}`` of two pytrees of one structure (float64 on the
  host; 0 where either side is all zero)."""
  import numpy as np  # pylint: disable=import-outside-toplevel

  dots, na, nb = {}, {}, {}
  for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
    name = module_name(path)
    x, y = np.asarray(x, np.float64).ravel(), np.asarray(y, np.float64).ravel()
    dots[name] = dots.get(name, 0.0) + float(x @ y)
    na[name] = na.get(name, 0.0) + float(x @ x)
    nb[name] = nb.get(name, 0.0) + float(y @ y)

  def cos(d, u, v):
    return d / np.sqrt(u * v) if u > 0 and v > 0 else 0.0

  out = {"all": cos(sum(dots.values()), sum(na.values()), sum(nb.values()))}
  out.update({k: cos(dots[k], na[k], nb[k]) for k in sorted(dots)})
  return out


def mlp_activations(graphdef, params, tokens) -> jax.Array:
  """[L, B, T, F] every layer's SwiGLU activation ``silu(gate x) * up x`` on ``tokens`` [B, T]
  (no left padding): each layer rerun from the model's own residual stream (its hidden
  states), attention included. A dense decoder with unfused projections only."""
  model = nnx.merge(graphdef, params)
  c = model.config
  if c.num_experts:
    raise ValueError("dormancy needs a dense decoder's MLP neurons; a mixture of experts has none")
  hidden = model(tokens, return_hidden_states=True).hidden_states
  B, T = tokens.shape
  start = jnp.zeros((B,), jnp.int32)
  mask = tf.attention_mask(start, jnp.zeros((), jnp.int32), T, T)
  rope = tf.rope_tables(jnp.broadcast_to(jnp.arange(T)[None], (B, T)), tf.rope_inv_freq(c))
  layers = model.layers.stacked(c.jnp_dtype)
  if "gate" not in layers or "q" not in layers:
    raise ValueError("dormancy reads unfused gate/up and q/k/v projections (fused ones given)")
  out = []
  for i in range(c.num_layers):
    p = jax.tree.map(lambda x: x[i], layers)
    h = hidden[i]
    q, k, v = tf.qkv(c, p, h, rope)
    h = h + ops.dense(tf.full_attention(c, q, k, v, mask), p["o"], 2)
    x = tf.rms_norm(h, p["mlp_norm"], c.rms_norm_eps)
    out.append(jax.nn.silu(ops.dense(x, p["gate"])) * ops.dense(x, p["up"]))
  return jnp.stack(out)


def dormancy_scores(graphdef, params, tokens) -> jax.Array:
  """[L, F] ReDo's ``E|h_u| / mean_v E|h_v|`` per layer (0: a neuron that never fires)."""
  act = jnp.abs(mlp_activations(graphdef, params, tokens).astype(jnp.float32))
  mean = jnp.mean(act, axis=(1, 2))  # [L, F]
  return mean / jnp.maximum(jnp.mean(mean, axis=-1, keepdims=True), 1e-12)


__all__ = [
  "confidence",
  "cosines",
  "dormancy_scores",
  "global_norm",
  "grad",
  "mlp_activations",
  "module_name",
  "nll",
  "sharpness",
]
