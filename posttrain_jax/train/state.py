"""Train state, optimisers, and model construction from a config."""

import dataclasses

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from posttrain_jax import models


@struct.dataclass
class TrainState:
  """Everything the jitted update reads and writes (donated between steps).

  Attributes:
    step: [] int32 number of optimiser updates applied.
    params: nnx.State of the model parameters.
    opt_state: the optax state.
  """

  step: jax.Array
  params: nnx.State
  opt_state: optax.OptState


def model_config(model_cfg, vocab_size: int) -> models.ModelConfig:
  """The ModelConfig of ``config.model``: a preset + overrides, or, with ``hf_path``, the
  Hugging Face folder's ``config.json`` (its own vocabulary; ``dtype`` from the config)."""
  hf_path = model_cfg.get("hf_path", "") or ""
  if hf_path:
    cfg = models.hf.load_config(hf_path, dtype=model_cfg.get("dtype", "float32"))
    return _execution_options(cfg, model_cfg)
  overrides = dict(model_cfg.get("overrides", {}) or {})
  overrides.setdefault("dtype", model_cfg.get("dtype", "float32"))
  overrides.setdefault("max_seq_len", model_cfg.get("max_seq_len", 256))
  return _execution_options(
    models.preset(model_cfg.preset, vocab_size=vocab_size, **overrides), model_cfg
  )


UNROLL_CHOICES = ("auto", "always", "never")  # config.model.unroll_layers


def _execution_options(cfg: models.ModelConfig, model_cfg) -> models.ModelConfig:
  """``cfg`` with ``config.model``'s execution options: remat, unroll_layers ('auto':
  unrolled on the CPU backend for at most 8 layers) and causal_block (-1: 64 on the CPU
  backend, else off); see ``ModelConfig``."""
  unroll = model_cfg.get("unroll_layers", "auto")  # checked by validate.py
  if unroll == "auto":
    unrolled = jax.default_backend() == "cpu" and cfg.num_layers <= 8
  else:
    unrolled = unroll == "always"
  block = int(model_cfg.get("causal_block", -1))
  if block == -1:
    block = 64 if jax.default_backend() == "cpu" else 0
  return dataclasses.replace(
    cfg,
    remat=bool(model_cfg.get("remat", False)),
    unroll_layers=unrolled,
    causal_block=block,
    attention_impl=model_cfg.get("attention_impl", "auto"),
  )


def build_model(model_cfg, vocab_size: int, seed: int):
  """(graphdef, params) of a fresh, randomly initialised Decoder of ``config.model``."""
  return models.init_decoder(model_config(model_cfg, vocab_size), seed)


def load_model(model_cfg, vocab_size: int, seed: int, mesh=None):
  """(graphdef, params) of the run's starting model: the pretrained weights of
  ``config.model.hf_path`` (streamed onto ``mesh`` with the trainer rules), else a fresh one."""
  hf_path = model_cfg.get("hf_path", "") or ""
  if not hf_path:
    return build_model(model_cfg, vocab_size, seed)
  model, _ = models.hf.load_pretrained(
    hf_path, dtype=model_cfg.get("dtype", "float32"), mesh=mesh, rules="trainer"
  )
  model.config = _execution_options(model.config, model_cfg)
  return nnx.split(model)


def _decay_mask(params):
  """Weight decay on matrices only: no decay for norms and biases."""

  def decide(path, _):
    name = "/".join(str(getattr(p, "key", p)) for p in path)
    return not ("norm" in name or "bias" in name)

  return jax.tree_util.tree_map_with_path(decide, params)


def make_optimizer(
  *,
  lr: float,
  steps: int,
  warmup_steps: int = 0,
  schedule: str = "constant",
  weight_decay: float = 0.0,
  grad_clip: float = 1.0,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
) -> optax.GradientTransformation:
  """AdamW with global-norm clipping and a warm-up then constant or cosine schedule."""
  warmup = optax.linear_schedule(0.0, lr, max(warmup_steps, 1))
  if schedule == "constant":
    after = optax.constant_schedule(lr)
  elif schedule == "cosine":
    after = optax.cosine_decay_schedule(lr, max(steps - warmup_steps, 1), alpha=0.1)
  else:
    raise ValueError(f"unknown lr schedule {schedule!r}; valid schedules: constant, cosine")
  lr_fn = optax.join_schedules([warmup, after], [max(warmup_steps, 1)]) if warmup_steps else after
  chain = [optax.adamw(lr_fn, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=_decay_mask)]
  if grad_clip:
    chain.insert(0, optax.clip_by_global_norm(grad_clip))
  return optax.chain(*chain)


def init_state(params: nnx.State, tx: optax.GradientTransformation) -> TrainState:
  """A fresh state on a copy of ``params`` (the update donates its state; the caller's arrays
  stay valid)."""
  params = jax.tree.map(jnp.copy, params)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def _all_finite(tree) -> jax.Array:
  """[] bool: every floating-point leaf of ``tree`` is finite."""
  leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(jnp.result_type(x), jnp.floating)]
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])) if leaves else True


def apply_gradients(
  state: TrainState, grads, loss: jax.Array, tx, max_update_ratio: float = 0.0
) -> tuple[TrainState, dict]:
  """One optimiser update, skipped (state unchanged) when it is non-finite or exploding.

  Non-finite: the loss, the gradient norm, the update, the new parameters or the new optimiser
  state hold a NaN or an infinity. Exploding (``max_update_ratio`` > 0): the update's global
  norm exceeds ``max_update_ratio`` x the parameters' global norm. ``train/skipped`` is 1 for a
  skipped update, ``train/nonfinite`` 1 when it was skipped for a non-finite value.
  """
  grad_norm = optax.tree.norm(grads)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  update_norm = optax.tree.norm(updates)
  finite = (
    jnp.isfinite(loss)
    & jnp.isfinite(grad_norm)
    & jnp.isfinite(update_norm)
    & _all_finite(params)
    & _all_finite(opt_state)
  )
  ok = finite
  if max_update_ratio:
    ok = ok & (update_norm <= max_update_ratio * optax.tree.norm(state.params))
  keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)
  new_state = TrainState(
    step=state.step + ok.astype(jnp.int32),
    params=keep(params, state.params),
    opt_state=keep(opt_state, state.opt_state),
  )
  return new_state, {
    "train/grad_norm": grad_norm,
    "train/update_norm": jnp.where(ok, update_norm, 0.0),
    "train/skipped": 1.0 - ok.astype(jnp.float32),
    "train/nonfinite": 1.0 - finite.astype(jnp.float32),
  }


def optimizer_kwargs(section) -> dict:
  """The make_optimizer arguments found in a config section."""
  names = [
    f
    for f in (
      "lr",
      "steps",
      "warmup_steps",
      "schedule",
      "weight_decay",
      "grad_clip",
      "b1",
      "b2",
      "eps",
    )
    if f in section
  ]
  return {n: section[n] for n in names}
