"""Fused projections for decoding: q/k/v as one weight, gate/up as one weight.

A decode step multiplies a few rows (one per sequence) by each weight; fusing the projections
that read the same input runs one matmul per pair instead of three and two
(``Decoder.layer_params`` builds the fused weights once per sampler call). The reference
block (``transformer.qkv``, ``transformer.mlp``) takes a layer's parameters either way.
"""

import jax
import jax.numpy as jnp

from posttrain_jax.models.ops import dense


def fuse_projections(p: dict) -> dict:
  """One layer's parameters with ``qkv`` [D, K, G+2, hd] (each kv head's G query heads, then
  its key and value) in place of q/k/v, and ``gate_up`` [D, F, 2] in place of gate/up.

  The kv-head (resp. mlp) axis stays the leading output axis, so a tensor-parallel split of
  heads or of the MLP splits the fused weight as it splits the separate ones.
  """
  p = dict(p)
  if all(n in p for n in ("q", "k", "v")):
    D, H, hd = p["q"].shape
    K = p["k"].shape[1]
    q = p.pop("q").reshape(D, K, H // K, hd)
    p["qkv"] = jnp.concatenate([q, p.pop("k")[:, :, None], p.pop("v")[:, :, None]], axis=2)
  if "gate" in p and "up" in p:
    p["gate_up"] = jnp.stack([p.pop("gate"), p.pop("up")], axis=-1)
  return p


def qkv(x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """``x`` [B, T, D] times the fused ``qkv`` weight -> q [B, T, H, hd], k and v [B, T, K, hd]."""
  y = dense(x, w)  # [B, T, K, G+2, hd]
  B, T, K, G2, hd = y.shape
  return y[:, :, :, : G2 - 2].reshape(B, T, K * (G2 - 2), hd), y[:, :, :, -2], y[:, :, :, -1]


def swiglu(x: jax.Array, gate_up: jax.Array, down: jax.Array) -> jax.Array:
  """``down(silu(gate x) * up x)`` with the fused ``gate_up`` weight [D, F, 2]."""
  y = dense(x, gate_up)  # [B, T, F, 2]
  return dense(jax.nn.silu(y[..., 0]) * y[..., 1], down)
