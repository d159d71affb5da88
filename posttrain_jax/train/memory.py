"""A memory estimate before the first stage: the big arrays of a run's configured batch and
lengths, against the memory this machine (or the accelerator) has.

:func:`estimate` counts, in bytes, what a run cannot avoid holding at its peak: the parameters,
AdamW's two moments and the frozen copies (reference, teacher) beside them, the sampler's KV
cache for a whole rollout batch, the loss's logits and attention scores for one minibatch, and
the host's tokenizer output for a batch. It is a lower estimate (activations other than the
attention scores and XLA's temporaries are left out), so a run it refuses cannot fit; one it
accepts may still not. :func:`check` refuses, with one line naming the parts and the keys to
lower, a run whose estimate exceeds the memory available; ``--dry_run`` prints the table.
"""

import os

import jax

from posttrain_jax.registry import ConfigError

TOKENIZER_BYTES_PER_TOKEN = 64  # a fast tokenizer's encoding: ids, offsets, masks, strings


def _bytes(dtype: str) -> int:
  return 2 if dtype in ("bfloat16", "float16") else 4


def estimate(config, model_config, num_params: int, prompt_len: int) -> dict[str, int]:
  """Bytes per part of the run's peak (see the module docstring), by name."""
  rl, m = config.rl, model_config
  rows = rl.prompts_per_step * rl.group_size
  seq = prompt_len + rl.max_new_tokens
  width = _bytes(m.dtype)
  copies = 1 + bool(rl.kl_coef) + bool(config.get("teacher", {}).get("enabled", False))
  minibatch = max(1, rows // max(1, rl.minibatches))
  parts = {
    "parameters": num_params * _bytes(m.param_dtype) * copies,
    "optimizer state": 2 * num_params * 4,
    "KV cache": rows * m.num_layers * 2 * m.num_kv_heads * m.head_dim * seq * width,
    "logits": 2 * minibatch * rl.max_new_tokens * m.vocab_size * 4,
    "attention scores": minibatch * m.num_layers * m.num_heads * seq * seq * width,
    "tokenizer batch": rows * seq * TOKENIZER_BYTES_PER_TOKEN,
  }
  pre = config.get("pretrain", None)
  if pre is not None and "pretrain" in tuple(config.get("stages", ())) and pre.get("steps", 0):
    batch = pre.batch_size
    parts["attention scores"] = max(
      parts["attention scores"], batch * m.num_layers * m.num_heads * seq * seq * width
    )
  return parts


def available_bytes() -> tuple[int, str]:
  """(bytes, where): the accelerator's memory limit when JAX reports one, else the host's
  available memory (MemAvailable, capped by the cgroup's limit)."""
  try:
    stats = jax.devices()[0].memory_stats() or {}
  except Exception:  # pylint: disable=broad-except  (CPU backends raise or return None)
    stats = {}
  if stats.get("bytes_limit"):
    return int(stats["bytes_limit"]) * jax.local_device_count(), "the accelerators"
  free = None
  try:
    with open("/proc/meminfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          free = int(line.split()[1]) * 1024
  except OSError:
    pass
  if free is None:
    free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  try:
    with open("/sys/fs/cgroup/memory.max", encoding="utf-8") as f:
      limit = f.read().strip()
    with open("/sys/fs/cgroup/memory.current", encoding="utf-8") as f:
      used = int(f.read().strip())
    if limit != "max":
      free = min(free, int(limit) - used)
  except (OSError, ValueError):
    pass
  return free, "this machine"


def _gib(n: int) -> str:
  return f"{n / 2**30:.3g} GiB"


def table(parts: dict[str, int]) -> str:
  """One line per part and the total, in GiB."""
  rows = [f"  {name}: {_gib(n)}" for name, n in parts.items()]
  return "\n".join(
    ["memory estimate (a lower bound):", *rows, f"  total: {_gib(sum(parts.values()))}"]
  )


def check(parts: dict[str, int], available: tuple[int, str]) -> None:
  """ConfigError when the estimate exceeds the available memory: the total, the largest parts
  and the keys that shrink them."""
  total, (free, where) = sum(parts.values()), available
  if total <= free:
    return
  largest = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
  shown = ", ".join(f"{name} {_gib(n)}" for name, n in largest)
  raise ConfigError(
    f"the run needs at least {_gib(total)} of memory ({shown}) and {where} has {_gib(free)} "
    "available; lower config.rl.prompts_per_step or config.rl.group_size (the rollout batch), "
    "config.rl.max_new_tokens, or raise config.rl.minibatches (the loss's batch); a smaller "
    "model (config.model) shrinks every part"
  )
