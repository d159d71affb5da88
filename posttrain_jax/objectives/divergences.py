"""Distillation loss terms: how far the student is from a teacher on the student's own tokens.

Shapes: ``B`` sequences, ``T`` completion tokens, ``V`` vocabulary. Every entry of
:data:`DIVERGENCES` has the same signature, so the RL loss calls any of them the same way::

    fn(logprobs, logits, teacher, mask, **hparams) -> (scalar masked-mean loss, metrics)

- ``logprobs`` [B, T] float32: the student's log-probs of the sampled tokens (differentiated).
- ``logits`` [B, T, V]: the student's logits, any float dtype (differentiated).
- ``teacher``: ``teacher_logits`` [B, T, V] for the full-vocabulary entries (``forward``,
  ``reverse``, ``jsd``), ``teacher_logprobs`` [B, T] for the sampled-token ones (``k1``, ``k2``,
  ``k3``); each entry declares which with ``registry.reads``. Stop-gradient inside.
- ``mask`` [B, T] float32 completion mask.

A full-vocabulary entry ignores ``logprobs`` and a sampled-token entry ignores ``logits`` (either
may be None there). Hyperparameters are keyword-only and per entry: ``teacher_temperature`` and
``chunk`` for the full-vocabulary entries, plus ``beta`` for ``jsd``; the sampled-token entries
take none (a teacher temperature for them is applied where ``teacher_logprobs`` are computed).

Everything is computed in float32. Beyond :data:`CHUNK_THRESHOLD` elements of ``[B, T, V]`` (or
with ``chunk=n``) the full-vocabulary entries run over the T axis in chunks of ``n`` positions
(a divisor of T, see :func:`chunk_size`) in a ``fori_loop`` whose forward pass also writes each
chunk's gradient into one buffer of the logits' dtype (a ``custom_vjp``; as Liger's fused
losses do), so no float32 ``[B, T, V]`` intermediate (log-softmax, probabilities) exists for the
whole batch, forward or backward: the extra memory is a few ``[B, n, V]`` float32 arrays besides
the logits' gradient. Gradients flow to ``logits`` only (not twice-differentiable there).

Metrics: ``distill/<name>`` (the value), ``distill/<name>_num`` and ``distill/<name>_den`` (masked
sum and token count, so token means stay exact across micro-batches), and for the
full-vocabulary entries ``distill/teacher_entropy`` (mean entropy of the tempered teacher).
"""

import functools
from typing import Callable

import chex
import jax
import jax.numpy as jnp

from posttrain_jax.objectives import kl
from posttrain_jax.registry import reads

sg = jax.lax.stop_gradient

# Elements of [B, T, V] beyond which the full-vocabulary terms run in chunks (chunk=0, auto):
# 2**22 float32 elements are 16 MiB per [B, T, V] intermediate.
CHUNK_THRESHOLD = 2**22


# ---------------------------------------------------------------------------------------------
# Per-token divergences over the vocabulary: log-probs [..., V] float32 -> [...] float32.
# A term whose weight is 0 contributes exactly 0, with a zero gradient (no NaN from -inf).


def _weighted_gap(weight: jax.Array, logw: jax.Array, logq: jax.Array) -> jax.Array:
  """Σ_v w (log w - log q), with 0 for w = 0 (the gap is zeroed before the product)."""
  return jnp.sum(weight * jnp.where(weight > 0, logw - logq, 0.0), axis=-1)


def token_forward_kl(logp_s: jax.Array, logp_t: jax.Array) -> jax.Array:
  """KL(p_T ‖ p_S) = Σ_v p_T (log p_T - log p_S) per token (mass-covering)."""
  return _weighted_gap(jnp.exp(logp_t), logp_t, logp_s)


def token_reverse_kl(logp_s: jax.Array, logp_t: jax.Array) -> jax.Array:
  """KL(p_S ‖ p_T) = Σ_v p_S (log p_S - log p_T) per token (mode-seeking)."""
  return _weighted_gap(jnp.exp(logp_s), logp_s, logp_t)


def token_generalized_jsd(logp_s: jax.Array, logp_t: jax.Array, *, beta: float) -> jax.Array:
  """GKD's generalised Jensen-Shannon divergence per token (Agarwal et al. 2024, "On-Policy
  Distillation of Language Models: Learning from Self-Generated Mistakes", eq. 1), in the
  convention of TRL's ``GKDTrainer.generalized_jsd_loss``: β weighs the teacher in the mixture,

      M = β p_T + (1 - β) p_S,    JSD_β = β KL(p_T ‖ M) + (1 - β) KL(p_S ‖ M),

  and, exactly as TRL special-cases them, β = 0 is the forward KL(p_T ‖ p_S) and β = 1 the
  reverse KL(p_S ‖ p_T). (The formula itself tends to β·KL(p_T ‖ p_S) as β → 0 and to
  (1-β)·KL(p_S ‖ p_T) as β → 1; TRL returns the unscaled KLs at the end points.)
  JSD_β(S, T) = JSD_{1-β}(T, S): symmetric in student and teacher at β = 0.5.
  """
  if beta == 0.0:
    return token_forward_kl(logp_s, logp_t)
  if beta == 1.0:
    return token_reverse_kl(logp_s, logp_t)
  p_s, p_t = jnp.exp(logp_s), jnp.exp(logp_t)
  mix = beta * p_t + (1.0 - beta) * p_s
  log_mix = jnp.log(jnp.where(mix > 0, mix, 1.0))
  return beta * _weighted_gap(p_t, logp_t, log_mix) + (1.0 - beta) * _weighted_gap(
    p_s, logp_s, log_mix
  )


def token_entropy(logp: jax.Array) -> jax.Array:
  """H(p) = -Σ_v p log p per token."""
  p = jnp.exp(logp)
  return -jnp.sum(p * jnp.where(p > 0, logp, 0.0), axis=-1)


# ---------------------------------------------------------------------------------------------
# The full-vocabulary path, chunked over token positions beyond CHUNK_THRESHOLD.


def _chunk_sums(token_fn, tau, zs, zt, m):
  """(Σ m·D, Σ m·H(p_T)) over rows of one chunk: zs, zt [n, V] (any float), m [n].

  Masked rows are replaced by zeros before the softmax, so garbage there (NaN, -inf) gets
  exactly zero gradient."""
  on = m > 0
  zs = jnp.where(on[:, None], zs.astype(jnp.float32), 0.0)
  zt = jnp.where(on[:, None], sg(zt).astype(jnp.float32), 0.0)
  logp_s = jax.nn.log_softmax(zs, axis=-1)
  logp_t = jax.nn.log_softmax(zt / tau, axis=-1)
  div, ent = token_fn(logp_s, logp_t), token_entropy(logp_t)
  return (jnp.sum(jnp.where(on, div * m, 0.0)), jnp.sum(jnp.where(on, ent * m, 0.0)))


def chunk_size(batch: int, length: int, vocab: int, chunk: int = 0) -> int:
  """Positions of the T axis per chunk, a divisor of ``length`` (every chunk the same shape):
  0 (no chunking) when ``chunk`` is 0 and ``batch · length · vocab`` fits in
  :data:`CHUNK_THRESHOLD`; otherwise the largest divisor of ``length`` not above ``chunk``, or,
  when ``chunk`` is 0 (automatic), not above ``CHUNK_THRESHOLD // (batch · vocab)``."""
  if chunk < 0:
    raise ValueError(f"chunk must be >= 0 (0: automatic), got {chunk}")
  if not chunk and batch * length * vocab <= CHUNK_THRESHOLD:
    return 0
  cap = min(length, chunk or max(1, CHUNK_THRESHOLD // (batch * vocab)))
  return next(d for d in range(cap, 0, -1) if length % d == 0)


def _chunk_loop(token_fn, tau, n, logits, teacher_logits, mask, with_grad):
  """Σ m·D, Σ m·H(p_T) over T/n chunks of [B, n, V] in a ``fori_loop``; with ``with_grad``
  also ∂(Σ m·D)/∂logits, written chunk by chunk into one [B, T, V] buffer of the logits' dtype
  (no float32 [B, T, V] exists; B stays whole, so a batch-sharded input is sliced locally)."""
  b, t, v = logits.shape

  def sums(zs, zt, m):  # [B, n, V], [B, n, V], [B, n]
    return _chunk_sums(token_fn, tau, zs.reshape(-1, v), zt.reshape(-1, v), m.reshape(-1))

  def body(i, carry):
    d, h, grad = carry
    zs, zt, m = (
      jax.lax.dynamic_slice_in_dim(x, i * n, n, axis=1) for x in (logits, teacher_logits, mask)
    )
    if grad is None:
      dd, hh = sums(zs, zt, m)
    else:
      (dd, hh), vjp = jax.vjp(lambda z: sums(z, zt, m), zs)
      (g,) = vjp((jnp.ones_like(dd), jnp.zeros_like(hh)))
      grad = jax.lax.dynamic_update_slice_in_dim(grad, g.astype(grad.dtype), i * n, axis=1)
    return d + dd, h + hh, grad

  zero = jnp.zeros((), jnp.float32)
  grad = jnp.zeros_like(logits) if with_grad else None
  return jax.lax.fori_loop(0, t // n, body, (zero, zero, grad))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _chunked_sums(token_fn, tau, n, logits, teacher_logits, mask):
  return _chunk_loop(token_fn, tau, n, logits, teacher_logits, mask, False)[:2]


def _chunked_sums_fwd(token_fn, tau, n, logits, teacher_logits, mask):
  d, h, grad = _chunk_loop(token_fn, tau, n, logits, teacher_logits, mask, True)
  return (d, h), (grad, teacher_logits, mask)


def _chunked_sums_bwd(token_fn, tau, n, residuals, cotangent):
  del token_fn, tau, n
  grad, teacher_logits, mask = residuals
  # The teacher is stop-gradient and the entropy does not depend on the student.
  return (
    (grad * cotangent[0].astype(grad.dtype)),
    jnp.zeros_like(teacher_logits),
    jnp.zeros_like(mask),
  )


_chunked_sums.defvjp(_chunked_sums_fwd, _chunked_sums_bwd)


def _full_vocab_sums(token_fn, logits, teacher_logits, mask, tau, chunk):
  """(Σ m·D, Σ m·H(p_T)) over the batch, in chunks of the T axis when :func:`chunk_size` says
  so: the forward pass computes each chunk's gradient too (one pass, no recomputation), so
  only the chunk's [B, n, V] float32 intermediates ever exist."""
  b, t, v = logits.shape
  n = chunk_size(b, t, v, chunk)
  if n == 0 or n == t:
    return _chunk_sums(
      token_fn, tau, logits.reshape(b * t, v), teacher_logits.reshape(b * t, v), mask.reshape(b * t)
    )
  return _chunked_sums(token_fn, tau, n, logits, teacher_logits, mask)


def _check_full_vocab(logits, teacher_logits, mask, teacher_temperature):
  chex.assert_rank([logits, teacher_logits, mask], [3, 3, 2])
  chex.assert_equal_shape_prefix([logits, mask], 2)
  if logits.shape != teacher_logits.shape:
    raise ValueError(
      f"student logits {logits.shape} and teacher logits {teacher_logits.shape} "
      "differ; a full-vocabulary divergence needs the teacher's logits on the "
      "student's tokens over the same vocabulary (same tokenizer)"
    )
  if not teacher_temperature > 0:
    raise ValueError(f"teacher_temperature must be > 0, got {teacher_temperature}")


def _metrics(name, num, den, extra=None):
  value = num / jnp.maximum(den, 1.0)
  out = {f"distill/{name}": value, f"distill/{name}_num": num, f"distill/{name}_den": den}
  out.update(extra or {})
  return value, out


def _full_vocab_loss(name, token_fn, logits, teacher_logits, mask, teacher_temperature, chunk):
  _check_full_vocab(logits, teacher_logits, mask, teacher_temperature)
  mask = mask.astype(jnp.float32)
  num, ent = _full_vocab_sums(token_fn, logits, teacher_logits, mask, teacher_temperature, chunk)
  den = jnp.sum(mask)
  return _metrics(name, num, den, {"distill/teacher_entropy": ent / jnp.maximum(den, 1.0)})


@reads("teacher_logits")
def forward_kl_loss(
  logprobs: jax.Array | None,
  logits: jax.Array,
  teacher_logits: jax.Array,
  mask: jax.Array,
  *,
  teacher_temperature: float = 1.0,
  chunk: int = 0,
):
  """Forward KL(p_T ‖ p_S) to a tempered teacher over the full vocabulary.

  SDFT/OPSD's per-token loss (research/methods_B.md §0) and Feedback Distillation's (§7, the
  direction *derived*); TS-OPSD's "policy reheating" (arXiv 2606.00755, §2) with the teacher
  tempered, p_T = softmax(z_T / τ) (*derived*):

      L = Σ_{b,t} m · Σ_v p_T (log p_T - log p_S) / Σ_{b,t} m,
      p_S = softmax(z_S),  p_T = softmax(sg(z_T) / τ).

  Its gradient in z_S is (p_S - p_T) · m / Σ m per token; its minimiser is z_S = z_T/τ + c.

  Args:
    logprobs: unused ([B, T] student log-probs; may be None).
    logits: [B, T, V] student logits z_S (differentiated; any float dtype).
    teacher_logits: [B, T, V] teacher logits z_T on the student's tokens (stop-gradient).
    mask: [B, T] float32 completion mask.
    teacher_temperature: τ > 0, dividing the teacher's logits only.
    chunk: at most this many positions of the T axis per chunk (0: automatic beyond
      CHUNK_THRESHOLD elements; see chunk_size).

  Returns:
    (masked token mean, metrics ``distill/forward{,_num,_den}``, ``distill/teacher_entropy``).
  """
  del logprobs
  return _full_vocab_loss(
    "forward", token_forward_kl, logits, teacher_logits, mask, teacher_temperature, chunk
  )


@reads("teacher_logits")
def reverse_kl_loss(
  logprobs: jax.Array | None,
  logits: jax.Array,
  teacher_logits: jax.Array,
  mask: jax.Array,
  *,
  teacher_temperature: float = 1.0,
  chunk: int = 0,
):
  """Reverse KL(p_S ‖ p_T) to a tempered teacher over the full vocabulary.

  The exact form of OPD's per-token reverse KL (GNDPO, arXiv 2606.09091, methods_A.md §2), and
  TS-OPSD's option (methods_B.md §2):

      L = Σ_{b,t} m · Σ_v p_S (log p_S - log p_T) / Σ_{b,t} m,   p_T = softmax(sg(z_T) / τ).

  Args and returns as :func:`forward_kl_loss` (metrics ``distill/reverse...``).
  """
  del logprobs
  return _full_vocab_loss(
    "reverse", token_reverse_kl, logits, teacher_logits, mask, teacher_temperature, chunk
  )


@reads("teacher_logits")
def jsd_loss(
  logprobs: jax.Array | None,
  logits: jax.Array,
  teacher_logits: jax.Array,
  mask: jax.Array,
  *,
  beta: float = 0.5,
  teacher_temperature: float = 1.0,
  chunk: int = 0,
):
  """GKD's generalised Jensen-Shannon divergence to a tempered teacher, full vocabulary.

  Agarwal et al. 2024 (arXiv 2306.13649, eq. 1), in the convention of TRL's
  ``GKDTrainer.generalized_jsd_loss`` (see :func:`token_generalized_jsd`):

      L = Σ_{b,t} m · [β KL(p_T ‖ M) + (1-β) KL(p_S ‖ M)] / Σ_{b,t} m,   M = β p_T + (1-β) p_S,

  β = 0: forward KL, β = 1: reverse KL (as TRL). TRL also divides the student's logits by its
  temperature; here τ tempers the teacher only (the student is scored as it samples).

  Args:
    beta: β in [0, 1] (a Python float). Other args and returns as :func:`forward_kl_loss`
    (metrics ``distill/jsd...``).
  """
  del logprobs
  if not 0.0 <= beta <= 1.0:
    raise ValueError(f"jsd beta must be in [0, 1] (0: forward KL, 1: reverse KL), got {beta}")

  def token_fn(logp_s, logp_t):
    return token_generalized_jsd(logp_s, logp_t, beta=beta)

  return _full_vocab_loss("jsd", token_fn, logits, teacher_logits, mask, teacher_temperature, chunk)


# ---------------------------------------------------------------------------------------------
# Sampled-token estimators of the reverse KL on student samples.


def _sampled_loss(name, logprobs, teacher_logprobs, mask):
  """Masked token mean of ``KL_ESTIMATORS[name](logprobs, sg(teacher_logprobs))``."""
  chex.assert_rank([logprobs, teacher_logprobs, mask], 2)
  chex.assert_equal_shape([logprobs, teacher_logprobs, mask])
  mask = mask.astype(jnp.float32)
  on = mask > 0
  lp = jnp.where(on, logprobs.astype(jnp.float32), 0.0)
  lt = jnp.where(on, sg(teacher_logprobs).astype(jnp.float32), 0.0)
  per_token = kl.KL_ESTIMATORS[name](lp, lt)
  num = jnp.sum(jnp.where(on, per_token * mask, 0.0))
  return _metrics(name, num, jnp.sum(mask))


_SAMPLED_DOC = """Sampled-token {k} estimate of the reverse KL(π_S ‖ π_T) on the student's tokens.

  Schulman (2020)'s estimator on samples y ~ π_S; CGTR's student term β Σ_t KL_t (arXiv
  2606.03532, methods_A.md §9):

      L = Σ_{{b,t}} m · {k}(log π_S(y_t), sg(log π_T(y_t))) / Σ_{{b,t}} m.

  As a loss (differentiated through log π_S of fixed samples) its expected gradient is {grad}.

  Args:
    logprobs: [B, T] float32 student log-probs of the sampled tokens (differentiated).
    logits: unused ([B, T, V] student logits; may be None).
    teacher_logprobs: [B, T] teacher log-probs of the same tokens (stop-gradient), at the
      teacher's temperature.
    mask: [B, T] float32 completion mask.

  Returns:
    (masked token mean, metrics ``distill/{k}``, ``distill/{k}_num``, ``distill/{k}_den``).
  """

_EXPECTED_GRADIENT = {
  "k1": "zero (E_π[∇ log π] = 0): k1 is a KL monitor or a reward, not a useful loss",
  "k2": "∇ KL(π_S ‖ π_T), the reverse KL's gradient",
  "k3": "∇ KL(π_T ‖ π_S), the FORWARD KL's gradient (Σ_y (π_S - π_T) ∇ log π_S)",
}


def _sampled_entry(k):
  @reads("teacher_logprobs")
  def entry(
    logprobs: jax.Array, logits: jax.Array | None, teacher_logprobs: jax.Array, mask: jax.Array
  ):
    del logits
    return _sampled_loss(k, logprobs, teacher_logprobs, mask)

  entry.__name__ = entry.__qualname__ = f"{k}_loss"
  entry.__doc__ = _SAMPLED_DOC.format(k=k, grad=_EXPECTED_GRADIENT[k])
  return entry


k1_loss = _sampled_entry("k1")
k2_loss = _sampled_entry("k2")
k3_loss = _sampled_entry("k3")

# Config name -> loss term, fn(logprobs, logits, teacher, mask, **hparams) -> (loss, metrics).
DIVERGENCES: dict[str, Callable] = {
  "forward": forward_kl_loss,
  "reverse": reverse_kl_loss,
  "jsd": jsd_loss,
  "k1": k1_loss,
  "k2": k2_loss,
  "k3": k3_loss,
}
