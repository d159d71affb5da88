"""Model configuration of the Llama/Qwen decoder family (dense or mixture of experts), and named
presets."""

import dataclasses

import jax.numpy as jnp

# RoPE frequency scalings the decoder implements (Hugging Face ``rope_type`` names).
ROPE_TYPES = ("default", "linear", "llama3")
# Attention implementations of the full forward (``attention.implementation``).
ATTENTION_IMPLS = ("auto", "reference", "xla", "cudnn")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyperparameters of a decoder-only LM.

  Attributes:
    vocab_size: V.
    hidden_size: D, the residual width.
    num_layers: L.
    num_heads: query heads H.
    num_kv_heads: key/value heads (grouped-query attention when < H).
    head_dim: per-head width; explicit, never derived from D/H (Qwen3 has D/H != head_dim).
    mlp_dim: SwiGLU inner width F.
    rope_theta: RoPE base frequency (rotate-half layout, as Hugging Face).
    rms_norm_eps: RMSNorm epsilon.
    qkv_bias: biases on q/k/v projections (Qwen2).
    qk_norm: per-head RMSNorm on q and k before RoPE (Qwen3).
    tie_embeddings: logits use the transposed input embedding.
    max_seq_len: longest sequence the KV cache and RoPE tables are built for.
    dtype: activation dtype name ('float32' or 'bfloat16'); log-probs are always float32.
    param_dtype: parameter dtype name.
    output_dim: width of the output head; 0 means the vocabulary (an LM). A critic uses 1
      (a value per position); a head that is not the vocabulary is never tied.
    rope_type: RoPE frequency scaling, as Hugging Face's ``rope_type``: 'default' (none),
      'linear' (frequencies divided by ``rope_factor``) or 'llama3' (Llama 3.1: long wavelengths
      divided by ``rope_factor``, short ones kept, a smooth ramp in between).
    rope_factor: scaling factor of 'linear' and 'llama3'.
    rope_low_freq_factor: 'llama3' ``low_freq_factor``.
    rope_high_freq_factor: 'llama3' ``high_freq_factor``.
    rope_original_max_len: 'llama3' ``original_max_position_embeddings`` (pretraining context).
    num_experts: E, routed experts per layer; 0 (default) is the dense SwiGLU MLP. With E > 0
      every layer's MLP is a sparse mixture of experts (``models/moe.py``; all-sparse stacks
      only, as Qwen3-MoE / Mixtral / Qwen2-MoE with ``decoder_sparse_step=1``).
    num_experts_per_tok: k, experts each token is routed to (top-k of the router softmax).
    moe_intermediate_size: each expert's SwiGLU width; 0 means ``mlp_dim``.
    norm_topk_prob: gate weights are the top-k probabilities renormalised to sum to one
      (Mixtral always; Qwen3-MoE / Qwen2-MoE when their config says so), else the top-k
      probabilities of the full softmax as they are.
    shared_expert_intermediate_size: width of an always-on shared SwiGLU expert, scaled by a
      sigmoid gate ``sigmoid(x . w)`` (Qwen2-MoE); 0 (default) for none.
    remat: recompute each block's activations in the backward pass (``jax.checkpoint`` on the
      scanned block): the backward holds one block's activations plus the [L, B, T, D]
      residual stream instead of every block's intermediates, for ~1/3 more FLOPs.
    unroll_layers: the full-sequence forward (training, scoring; not decoding) unrolls its
      loop over the layers instead of scanning it. XLA:CPU then schedules and fuses across
      layers: the tiny GRPO train step ran ~18% faster (scripts/bench.py), for a compile time
      that grows with depth. Same numbers either way (tested). ``config.model.unroll_layers``
      'auto' turns it on on the CPU backend for models of at most 8 layers.
    causal_block: the full causal forward computes attention in blocks of this many queries,
      each against the keys up to its end only (``attention.causal_blocks``): about half the
      score matrix for long sequences. 0: one dense product. ``config.model.causal_block`` -1
      (auto) is 64 on the CPU backend and 0 elsewhere. Used by the 'reference' attention only.
    attention_impl: the full forward's attention (training, scoring, ``grouped_forward``):
      'reference' (``transformer.attention``, or causal blocks), 'xla' or 'cudnn'
      (``jax.nn.dot_product_attention`` with that implementation), or 'auto' (default):
      'reference' on CPU, on GPU 'cudnn' (the fused kernel) for bfloat16 compute and head dims
      it takes, else 'xla' (``models/attention.py``). Decoding always reads the cache with
      ``attention.grouped_products``.
    router_aux_loss_coef: weight of the load-balancing loss (``LMOutput.aux_loss``) that a train
      step adds to its objective; the model only returns the unweighted loss.
  """

  vocab_size: int = 32
  hidden_size: int = 128
  num_layers: int = 4
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 32
  mlp_dim: int = 512
  rope_theta: float = 10_000.0
  rms_norm_eps: float = 1e-6
  qkv_bias: bool = False
  qk_norm: bool = False
  tie_embeddings: bool = True
  max_seq_len: int = 256
  dtype: str = "float32"
  param_dtype: str = "float32"
  output_dim: int = 0
  rope_type: str = "default"
  rope_factor: float = 1.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_len: int = 8192
  num_experts: int = 0
  num_experts_per_tok: int = 2
  moe_intermediate_size: int = 0
  norm_topk_prob: bool = True
  shared_expert_intermediate_size: int = 0
  router_aux_loss_coef: float = 0.001
  remat: bool = False
  unroll_layers: bool = False
  causal_block: int = 0
  attention_impl: str = "auto"

  @property
  def head_dim_out(self) -> int:
    return self.output_dim or self.vocab_size

  @property
  def expert_dim(self) -> int:
    """Each routed expert's SwiGLU width."""
    return self.moe_intermediate_size or self.mlp_dim

  @property
  def is_moe(self) -> bool:
    return self.num_experts > 0

  @property
  def tied(self) -> bool:
    return self.tie_embeddings and not self.output_dim

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
      )
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in ("float32", "bfloat16"):
        raise ValueError(f"{name} must be 'float32' or 'bfloat16', got {getattr(self, name)!r}")
    if self.rope_type not in ROPE_TYPES:
      raise ValueError(f"rope_type must be one of {', '.join(ROPE_TYPES)}, got {self.rope_type!r}")
    if self.rope_type == "llama3" and not self.rope_high_freq_factor > self.rope_low_freq_factor:
      raise ValueError(
        f"llama3 RoPE needs rope_high_freq_factor > rope_low_freq_factor, got "
        f"{self.rope_high_freq_factor} <= {self.rope_low_freq_factor}"
      )
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(
        f"attention_impl must be one of {', '.join(ATTENTION_IMPLS)}, got {self.attention_impl!r}"
      )
    if self.num_experts < 0:
      raise ValueError(f"num_experts must be >= 0 (0 = dense MLP), got {self.num_experts}")
    if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
      raise ValueError(
        f"num_experts_per_tok={self.num_experts_per_tok} must be in "
        f"[1, num_experts={self.num_experts}]"
      )
    if self.shared_expert_intermediate_size and not self.num_experts:
      raise ValueError("shared_expert_intermediate_size > 0 needs num_experts > 0")

  @property
  def jnp_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def jnp_param_dtype(self):
    return jnp.dtype(self.param_dtype)

  def num_params(self) -> int:
    """Parameter count (embeddings counted once when tied)."""
    d, h, kv, hd, f = (
      self.hidden_size,
      self.num_heads,
      self.num_kv_heads,
      self.head_dim,
      self.mlp_dim,
    )
    attn = d * h * hd * 2 + d * kv * hd * 2
    if self.qkv_bias:
      attn += (h + 2 * kv) * hd
    if self.qk_norm:
      attn += 2 * hd
    if self.num_experts:
      mlp = self.num_experts * (3 * d * self.expert_dim + d)  # experts + router
      if self.shared_expert_intermediate_size:
        mlp += 3 * d * self.shared_expert_intermediate_size + d  # shared expert + gate
    else:
      mlp = 3 * d * f
    per_layer = attn + mlp + 2 * d
    head = 0 if self.tied else d * self.head_dim_out
    return self.num_layers * per_layer + self.vocab_size * d + d + head


# Presets. `tiny` is ~1M parameters (the CPU quickstart); the others scale width and depth.
PRESETS: dict[str, dict] = {
  "nano": dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, mlp_dim=256),
  "tiny": dict(
    hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32, mlp_dim=512
  ),
  "small": dict(
    hidden_size=256, num_layers=6, num_heads=8, num_kv_heads=4, head_dim=32, mlp_dim=1024
  ),
  "base": dict(
    hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, head_dim=64, mlp_dim=2048
  ),
  "medium": dict(
    hidden_size=1024, num_layers=16, num_heads=16, num_kv_heads=8, head_dim=64, mlp_dim=4096
  ),
  # Mixtures of experts (8 experts, top-2, Qwen3-style q/k norm): the routing-replay toys.
  "nano_moe": dict(
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    mlp_dim=256,
    qk_norm=True,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=64,
  ),
  "tiny_moe": dict(
    hidden_size=128,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    mlp_dim=512,
    qk_norm=True,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=128,
  ),
}


def preset(name: str, **overrides) -> ModelConfig:
  """A ModelConfig from a preset name, with field overrides (e.g. ``vocab_size``)."""
  if name not in PRESETS:
    raise ValueError(f"unknown model preset {name!r}; valid presets: {', '.join(PRESETS)}")
  fields = {f.name for f in dataclasses.fields(ModelConfig)}
  bad = sorted(set(overrides) - fields)
  if bad:
    raise ValueError(f"unknown model field(s) {bad}; valid fields: {sorted(fields)}")
  return ModelConfig(**{**PRESETS[name], **overrides})


def scale_rope_frequencies(config: ModelConfig, inv_freq):
  """RoPE inverse frequencies ``inv_freq`` [hd/2] scaled as ``config.rope_type`` says.

  'default' keeps them. 'linear' divides every frequency by the factor. 'llama3' (Llama 3.1, as
  Hugging Face's ``_compute_llama3_parameters``): with wavelength λ = 2π/f, original context C,
  factor s and low/high frequency factors a < b, frequencies with λ < C/b are kept, those with
  λ > C/a are divided by s, and in between f' = (1-γ) f/s + γ f with γ = (C/λ - a)/(b - a).
  """
  if config.rope_type == "linear":
    return inv_freq / config.rope_factor
  if config.rope_type != "llama3":
    return inv_freq
  factor, low, high = (
    config.rope_factor,
    config.rope_low_freq_factor,
    config.rope_high_freq_factor,
  )
  context = config.rope_original_max_len
  wavelen = 2 * jnp.pi / inv_freq
  scaled = jnp.where(wavelen > context / low, inv_freq / factor, inv_freq)
  smooth = (context / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = (wavelen >= context / high) & (wavelen <= context / low)
  return jnp.where(medium, smoothed, scaled)
