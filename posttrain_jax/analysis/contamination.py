"""LaRA: contamination detection from how hidden states respond to controlled perturbations of an
item (arXiv 2605.29888; methods_B.md section 11). The three per-layer metrics and the
aggregation are *derived* forms (the section says so); each is one function.

Inputs are hidden states at one token position (e.g. the last prompt token, :mod:`.
representations`' capture), per layer ``l``: ``h`` [L, D] for the item ``x``, ``h_rm`` [L, D]
for an information-removed variant, ``h_para`` [J, L, D] for J paraphrases.

- Representation Shift Magnitude ``RSM_l = 1 - cos(h_l(x), h_l(x^rm))`` (contaminated items
  shift more when information is removed);
- Directional Collapse ``DC_l = s_1^2 / sum_j s_j^2``, the top singular value's share of the
  centred stack ``[h_l(x); h_l(x^para_1..J); h_l(x^rm)]`` (in ``[1/rank, 1]``; higher: the
  variants collapse onto one direction);
- Representation Stability Index ``RSI_l = mean_j cos(h_l(x), h_l(x^para_j))`` (higher: more
  rigid under paraphrase).

Detection (:func:`lara_scores`): each metric is standardised per layer against a reference set
of items known to be clean, ``z = (m - mean_ref) / std_ref``, and the item's score is the mean of
the z-scores over metrics and layers (all three metrics grow with contamination, so no sign
flips). Output-level baselines on the item's reference answer (:func:`output_baselines`): mean
log-likelihood, Min-K% probability (mean of the lowest k% token log-probs) and mean entropy
(lower entropy: more likely seen; the sign makes higher mean more contaminated).
"""

import jax
import jax.numpy as jnp


def _cos(a: jax.Array, b: jax.Array) -> jax.Array:
  """Cosine along the last axis (0 where a vector is zero)."""
  num = jnp.sum(a * b, axis=-1)
  den = jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1)
  return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)


def rsm(h: jax.Array, h_rm: jax.Array) -> jax.Array:
  """[L] ``1 - cos(h_l(x), h_l(x^rm))``: ``h``, ``h_rm`` [L, D]."""
  return 1.0 - _cos(h, h_rm)


def rsi(h: jax.Array, h_para: jax.Array) -> jax.Array:
  """[L] ``mean_j cos(h_l(x), h_l(x^para_j))``: ``h`` [L, D], ``h_para`` [J, L, D]."""
  return jnp.mean(_cos(h[None], h_para), axis=0)


def dc(h: jax.Array, h_para: jax.Array, h_rm: jax.Array) -> jax.Array:
  """[L] the top direction's share of the centred variants' variance."""
  stack = jnp.concatenate([h[None], h_para, h_rm[None]], axis=0)  # [J+2, L, D]
  stack = jnp.swapaxes(stack, 0, 1)  # [L, J+2, D]
  centred = stack - jnp.mean(stack, axis=1, keepdims=True)
  s = jnp.linalg.svd(centred, compute_uv=False)  # [L, min(J+2, D)]
  power = jnp.square(s)
  total = jnp.sum(power, axis=-1)
  return jnp.where(total > 0, power[:, 0] / jnp.where(total > 0, total, 1.0), 1.0)


def metrics(h, h_para, h_rm) -> jax.Array:
  """[3, L]: RSM, DC and RSI of one item."""
  return jnp.stack([rsm(h, h_rm), dc(h, h_para, h_rm), rsi(h, h_para)])


def lara_scores(features: jax.Array, reference: jax.Array) -> jax.Array:
  """[N] aggregate scores of items' ``features`` [N, 3, L] (from :func:`metrics`), each metric
  and layer standardised against ``reference`` [M, 3, L] (known-clean items), then averaged.
  Higher: more likely contaminated. Invariant to the order of the layers."""
  mean = jnp.mean(reference, axis=0)
  std = jnp.std(reference, axis=0)
  z = (features - mean) / jnp.where(std > 0, std, 1.0)
  return jnp.mean(z, axis=(1, 2))


def output_baselines(logprobs: jax.Array, entropy: jax.Array, mask: jax.Array, k: float = 0.2):
  """Per item, from the model's token log-probs of its reference answer ``logprobs`` [N, T],
  the next-token entropies ``entropy`` [N, T] and ``mask`` [N, T]: ``loglik`` (mean log-prob),
  ``min_k`` (mean of the lowest ``k`` fraction of log-probs, at least one token) and
  ``neg_entropy`` (minus the mean entropy). Each: higher means more likely seen."""
  n = jnp.maximum(jnp.sum(mask, axis=1), 1.0)
  loglik = jnp.sum(logprobs * mask, axis=1) / n
  neg_entropy = -jnp.sum(entropy * mask, axis=1) / n
  ordered = jnp.sort(jnp.where(mask > 0, logprobs, jnp.inf), axis=1)
  count = jnp.maximum(jnp.floor(k * n), 1.0)
  take = (jnp.arange(logprobs.shape[1])[None, :] < count[:, None]).astype(jnp.float32)
  min_k = jnp.sum(jnp.where(take > 0, ordered, 0.0), axis=1) / count
  return {"loglik": loglik, "min_k": min_k, "neg_entropy": neg_entropy}
