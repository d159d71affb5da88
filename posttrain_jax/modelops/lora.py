"""LoRA (Hu et al. 2021) as pure functions over the decoder's parameter tree.

The base parameters stay frozen and are never copied: :func:`apply` returns the effective
weights ``W + (alpha / r) · A B`` for the targeted projections (and the base arrays themselves
everywhere else), so a training step differentiates only the adapters, and the reference model
of an RL run is the base tree itself (the run holds one copy of the base weights). :func:`merge`
is the same sum done once, for export (``models.hf.save_pretrained``).

Our layer weights are stacked on a leading ``layers`` axis (``[L, in..., out...]``), so an
adapter is ``a [L, in, r]`` and ``b [L, r, out]`` with ``in``/``out`` the flattened input and
output axes of that weight (e.g. ``q [L, D, H, hd]``: in = D, out = H·hd). ``a`` starts random
(variance 1/in) and ``b`` at zero, so a fresh adapter leaves the model unchanged.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

# Projection name (under ``layers``) -> number of input axes after the ``layers`` axis.
INPUT_AXES = {"q": 1, "k": 1, "v": 1, "o": 2, "gate": 1, "up": 1, "down": 1}


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """Which projections get adapters, and their rank and scale.

  Attributes:
    rank: r, the adapter's inner width.
    alpha: the update is scaled by alpha / r (PEFT's convention).
    targets: projection names under ``layers`` (keys of :data:`INPUT_AXES`).
  """

  rank: int = 8
  alpha: float = 16.0
  targets: tuple = ("q", "k", "v", "o", "gate", "up", "down")

  def __post_init__(self):
    bad = sorted(set(self.targets) - set(INPUT_AXES))
    if bad:
      raise ValueError(
        f"unknown LoRA target(s) {bad}; valid targets: {', '.join(sorted(INPUT_AXES))}"
      )
    if not self.targets:
      raise ValueError("LoRA needs at least one target projection")
    if not (isinstance(self.rank, int) and self.rank > 0):
      raise ValueError(f"LoRA rank must be a positive int, got {self.rank!r}")

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


def _pure(params) -> dict:
  return params.to_pure_dict() if hasattr(params, "to_pure_dict") else params


def _split(shape, name):
  """(L, in, out) sizes of a stacked weight."""
  n_in = INPUT_AXES[name]
  return shape[0], math.prod(shape[1 : 1 + n_in]), math.prod(shape[1 + n_in :])


def init(params, config: LoraConfig, key: jax.Array) -> dict:
  """Fresh adapters ``{name: {"a": [L, in, r], "b": [L, r, out]}}`` (float32; ``b`` = 0)."""
  layers = _pure(params)["layers"]
  out = {}
  for i, name in enumerate(config.targets):
    L, n_in, n_out = _split(layers[name].shape, name)
    a = jax.random.normal(jax.random.fold_in(key, i), (L, n_in, config.rank), jnp.float32)
    out[name] = {"a": a / math.sqrt(n_in), "b": jnp.zeros((L, config.rank, n_out), jnp.float32)}
  return out


def delta(adapter: dict, shape, name: str, scale: float) -> jax.Array:
  """The weight update ``scale · A B`` of one adapter, in the weight's stacked shape."""
  ab = jnp.einsum("lir,lro->lio", adapter["a"], adapter["b"]) * scale
  return ab.reshape(shape)


def apply(params, adapters: dict, config: LoraConfig):
  """Effective parameters: base + adapter on each target, in the tree type of ``params`` (an
  ``nnx.State`` keeps its Variables and their sharding metadata; a pure dict stays one).

  Untargeted leaves are the base arrays themselves (no copy). Differentiable in ``adapters``.
  """
  pure = _pure(params)
  layers = dict(pure["layers"])
  for name, adapter in adapters.items():
    w = layers[name]
    layers[name] = w + delta(adapter, w.shape, name, config.scale).astype(w.dtype)
  out = {**pure, "layers": layers}
  if isinstance(params, nnx.State):
    state = jax.tree.map(lambda x: x, params)
    nnx.replace_by_pure_dict(state, out)
    return state
  return out


def merge(params, adapters: dict, config: LoraConfig) -> dict:
  """The merged weights for export: :func:`apply` done once (same tree as the base)."""
  return jax.jit(lambda p, a: apply(p, a, config))(_pure(params), adapters)


def num_params(adapters: dict) -> int:
  """Trainable parameter count of the adapters."""
  return sum(x.size for x in jax.tree.leaves(adapters))
