"""The shared-prompt forward (``grouped_forward``): several completions of each prompt, the
prompt's positions computed once.

GRPO scores ``group`` completions of each of ``P`` prompts. Row ``b`` of the batch is
``prompts[b // group]`` followed by ``completions[b]``. Instead of running every row's prompt,
the residual stream joins, per prompt, its ``S`` positions and its ``group`` completion rows'
``T`` positions each: ``[P, S + group*T, D]``. The projections and the MLP run on all
positions at once (one matmul per weight); only attention sees two parts: the prompts attend
causally to themselves, each completion row to its prompt's keys (computed once, repeated to
the group's rows; gradients flow back through the repeat as sums) and causally to its own.
Joining along the position axis keeps the rows' sharding: rows ``i*group .. (i+1)*group - 1``
of the completions belong to prompt ``i``, so the reshapes move no row across shards.

Shapes: ``P`` prompts, ``S`` prompt length, ``B = P*group`` rows, ``T`` completion length,
``K`` kv heads, ``hd`` head dim, ``D`` width, ``V`` vocabulary.
"""

import jax
import jax.numpy as jnp

from posttrain_jax import parallel
from posttrain_jax.models import transformer
from posttrain_jax.models.config import ModelConfig
from posttrain_jax.models.custom_grad import embed_lookup
from posttrain_jax.models.ops import dense

_RESIDUAL = ("batch", "act_length", "act_embed")


def join(prompt_part: jax.Array, completion_part: jax.Array, group: int) -> jax.Array:
  """``[P, S, ...]`` and ``[P*group, T, ...]`` -> ``[P, S + group*T, ...]``."""
  P = prompt_part.shape[0]
  rest = completion_part.shape[2:]
  return jnp.concatenate(
    [prompt_part, completion_part.reshape(P, group * completion_part.shape[1], *rest)], axis=1
  )


def grouped_block(
  c: ModelConfig,
  p: dict,
  h: jax.Array,
  rope: tuple,
  mask_p: jax.Array,
  mask_c: jax.Array,
  prompt_len: int,
  group: int,
) -> jax.Array:
  """One dense block on the joined residual stream ``h`` [P, S + group*T, D]; ``mask_p``
  [P, S, S] and ``mask_c`` [B, T, S+T] the prompts' and the completions' attention masks."""
  P, S = h.shape[0], prompt_len
  T = (h.shape[1] - S) // group
  B = P * group
  q, k, v = transformer.qkv(c, p, h, rope)
  split = lambda x: (x[:, :S], x[:, S:].reshape(B, T, *x.shape[2:]))
  (qp, qc), (kp, kc), (vp, vc) = split(q), split(k), split(v)
  ap = transformer.full_attention(c, qp, kp, vp, mask_p)
  keys = jnp.concatenate([jnp.repeat(kp, group, axis=0), kc], axis=1)  # [B, S+T, K, hd]
  values = jnp.concatenate([jnp.repeat(vp, group, axis=0), vc], axis=1)
  ac = transformer.full_attention(c, qc, keys, values, mask_c)
  a = join(ap, ac, group)
  return transformer.mlp(c, p, h + dense(a, p["o"], 2))


def grouped_forward(
  model, prompts: jax.Array, prompt_start: jax.Array, completions: jax.Array, group: int
):
  """The forward of ``group`` continuations of each prompt, the prompt computed once.

  The result equals the full forward over the concatenated rows (``model(concat, start=
  repeat(prompt_start, group))``) at positions ``S-1 .. S+T-1``: the prompt's last position
  (predicting the first completion token) and every completion position. It costs about
  ``(P*S + B*T) / (B*(S+T))`` of that forward. Dense models only (a mixture of experts counts
  every row's prompt tokens in its load-balancing loss).

  Args:
    model: a ``transformer.Decoder``.
    prompts: [P, S] int32 prompt tokens, left-padded.
    prompt_start: [P] int32 first real index of each prompt.
    completions: [P*group, T] int32 tokens after the prompt (T may be 0).
    group: rows per prompt.

  Returns:
    LMOutput(logits [P*group, T+1, V] float32, None, None).
  """
  c = model.config
  if c.num_experts:
    raise ValueError(
      "models.grouped_forward (the shared-prompt forward) supports dense models only; "
      "run the full forward (e.g. config.rl.shared_prefix=False)"
    )
  P, S = prompts.shape
  B, T = completions.shape
  if group < 1 or B != P * group:
    raise ValueError(
      f"grouped forward: {B} completion rows are not {group} per each of {P} prompts"
    )
  dtype = c.jnp_dtype
  prompt_start = prompt_start.astype(jnp.int32)
  row_start = jnp.repeat(prompt_start, group)
  inv_freq = transformer.rope_inv_freq(c)
  rope_p = transformer.rope_tables(
    jnp.maximum(jnp.arange(S)[None, :] - prompt_start[:, None], 0), inv_freq
  )
  rope_c = transformer.rope_tables(
    jnp.maximum(S + jnp.arange(T)[None, :] - row_start[:, None], 0), inv_freq
  )
  mask_p = transformer.attention_mask(prompt_start, jnp.zeros((), jnp.int32), S, S)
  mask_c = transformer.attention_mask(row_start, jnp.asarray(S, jnp.int32), T, S + T)
  embed = model.embed[...].astype(dtype)
  rope = tuple(join(a, b, group) for a, b in zip(rope_p, rope_c))
  h = embed_lookup(embed, join(prompts, completions.astype(prompts.dtype), group))
  h = parallel.constrain(h, _RESIDUAL)  # [P, S+group*T, D]

  def body(h, p):
    h = grouped_block(c, p, h, rope, mask_p, mask_c, S, group)
    return parallel.constrain(h, _RESIDUAL), None

  if c.remat:
    body = jax.checkpoint(body, prevent_cse=False)
  unroll = c.num_layers if c.unroll_layers else 1
  h, _ = jax.lax.scan(body, h, model.layers.stacked(dtype), unroll=unroll)
  hp, hc = h[:, :S], h[:, S:].reshape(B, T, h.shape[-1])
  h = jnp.concatenate([jnp.repeat(hp[:, -1:], group, axis=0), hc], axis=1)  # [B, T+1, D]
  return transformer.LMOutput(model.head(h, embed), None, None)
