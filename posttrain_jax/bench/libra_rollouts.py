"""Libra's C-MLFQ measured on this library's own multi-turn rollouts (experiments/libra_rollouts.py).

The workload is agentic episodes with long-tailed turn counts: episode ``i`` makes
``n_i = 1 + floor(LogNormal(0, sigma))`` tool calls (capped), and the host ends it after the
observation of its ``n_i``-th. The policy is a model whose next-token distribution is uniform
(the ``tiny`` preset with a zero final norm), so a turn ends where it writes the one-token call
end (mean ``vocab_size`` tokens per turn) and EOS is never sampled: the long tail is the
workload's, not a trained model's. The rollouts are real (the jitted multi-turn loop, its KV
cache and the host round trips, rollout/buckets.py); only their content is random.

:func:`measure` times one rollout of the workload's episodes under a bucket spec, after a
warm-up rollout of the same episodes (other keys) that compiles the programs it needs; its
record has the wall time, the episodes and tokens per second, the batches and the rows decoded,
and the compilations the timed rollout still needed.
"""

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posttrain_jax import models, rollout
from posttrain_jax.bench import speed as bench

PAD, STOP = 0, 2


@dataclasses.dataclass(frozen=True)
class Workload:
  """The episodes of one rollout and the policy that plays them.

  Attributes:
    episodes: N, episodes per rollout (an RL step's prompts x samples).
    sigma: the turn counts' log-normal scale (1 + floor(LogNormal(0, sigma)) calls).
    max_calls: the cap on an episode's calls.
    vocab_size: V of the uniform policy: a turn's mean length in tokens.
    obs_tokens: the tokens of each observation.
    prompt_tokens: (lo, hi) prompt lengths, drawn uniformly.
    budget: T, the token budget of an episode.
    preset: the model preset.
  """

  episodes: int = 64
  sigma: float = 1.0
  max_calls: int = 12
  vocab_size: int = 32
  obs_tokens: int = 8
  prompt_tokens: tuple = (8, 24)
  budget: int = 512
  preset: str = "tiny"


def policy(w: Workload):
  """(graphdef, params) of the uniform policy."""
  graphdef, params = nnx.split(
    models.Decoder(models.preset(w.preset, vocab_size=w.vocab_size), rngs=nnx.Rngs(0))
  )
  params = jax.tree.map(lambda x: x, params)
  params["final_norm"][...] = jnp.zeros_like(params["final_norm"][...])
  return graphdef, params


def episodes(w: Workload, seed: int):
  """(prompts [N, S], mask [N, S], calls [N]) of the workload's draw ``seed``."""
  rng = np.random.default_rng(seed)
  calls = np.minimum(1 + np.floor(rng.lognormal(0.0, w.sigma, w.episodes)), w.max_calls)
  lo, hi = w.prompt_tokens
  ids = [
    list(rng.integers(3, w.vocab_size, int(rng.integers(lo, hi + 1)))) for _ in range(w.episodes)
  ]
  tokens, mask = rollout.left_pad(ids, PAD)
  return tokens, mask, calls.astype(int)


class Host:
  """The env side: observation tokens for every call, the end after an episode's last call."""

  def __init__(self, w: Workload, calls):
    self.w, self.calls, self.made = w, np.asarray(calls), np.zeros(len(calls), int)

  def __call__(self, rows, turns):
    out = []
    for e in map(int, rows):
      self.made[e] += 1
      obs = [3 + (e + self.made[e] + j) % (self.w.vocab_size - 3) for j in range(self.w.obs_tokens)]
      out.append((obs, bool(self.made[e] >= self.calls[e])))
    return out


def scheduler(w: Workload, graphdef, levels) -> rollout.BucketScheduler:
  cfg = rollout.SamplerConfig(
    max_new_tokens=w.budget, eos_id=w.vocab_size, pad_id=PAD, decode_chunk=0
  )
  return rollout.BucketScheduler(
    graphdef, cfg, rollout.TurnConfig((STOP,), w.obs_tokens), [rollout.Bucket(*b) for b in levels]
  )


def measure(w: Workload, levels, seed: int, model=None) -> dict:
  """One timed rollout of draw ``seed`` under the bucket levels ``((width, quantum, calls),
  ...)``, after two untimed warm-ups of the same episodes (other keys, so other lengths and
  shapes). ``seconds`` leaves out the compilations the timed rollout still needed (tracing,
  lowering and compiling: a run of many steps compiles each shape once); ``raw_seconds`` keeps
  them. ``calls_ok``: the share of episodes not truncated whose calls are their drawn count."""
  graphdef, params = model or policy(w)
  tokens, mask, calls = episodes(w, seed)
  sched = scheduler(w, graphdef, levels)
  for k in range(2):
    sched(params, tokens, mask, jax.random.key(10_000 * (k + 1) + seed), respond=Host(w, calls))
  counter = bench.CompileCounter()
  start = time.perf_counter()
  ro = sched(params, tokens, mask, jax.random.key(seed), respond=Host(w, calls))
  jax.block_until_ready(ro.tokens)
  raw = time.perf_counter() - start
  seconds = max(raw - counter.total_seconds, 1e-9)
  stats = sched.last_stats
  own, env = np.asarray(ro.completion_mask), np.asarray(ro.env_mask)
  written = float(np.sum(own + env))
  done = ~np.asarray(ro.truncated)
  starts = (env > 0) & ~np.pad(env > 0, ((0, 0), (1, 0)))[:, :-1]
  made = starts.sum(axis=1)
  return {
    "seconds": seconds,
    "throughput": w.episodes / seconds,
    "tokens_per_s": written / seconds,
    "raw_seconds": raw,
    "raw_throughput": w.episodes / raw,
    "tokens": written,
    "truncated": float(np.mean(~done)),
    "calls_ok": float(np.mean(made[done] == calls[done])) if done.any() else 0.0,
    "batches": stats.batches,
    "rows": stats.rows,
    "steps": stats.decode_steps,
    "row_steps": stats.row_steps,
    "fill": stats.real_rows / max(stats.rows, 1),
    "compiles": counter.count,
    "compile_s": counter.total_seconds,
  }


def run_seed(arms: dict, metrics, seed: int, w: Workload | None = None) -> list[dict]:
  """Every arm's record (``metrics`` of :func:`measure`) on draw ``seed``, the arms (name ->
  bucket levels) run one after another on one policy."""
  w = w or Workload()
  model = policy(w)
  return [
    {"arm": arm, "seed": seed, **{k: record[k] for k in metrics}}
    for arm, levels in arms.items()
    for record in [measure(w, levels, seed, model)]
  ]
