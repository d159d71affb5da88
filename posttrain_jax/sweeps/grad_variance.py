"""Policy-gradient variance of advantage estimators, measured on the same rollouts.

For a reproduction config whose arms differ in ``rl.advantage`` (e.g. MaxPO vs PKPO vs GRPO),
:func:`measure` loads one checkpoint, draws ``N`` independent batches of ``P`` prompts x ``G``
rollouts, and for every batch computes each arm's advantages and the gradient of its policy
loss at ratio 1 (the on-policy policy gradient) with respect to all parameters. Every arm sees
the same rollouts, so the comparison is paired. Per arm, with ``g_i`` the flattened gradient
of batch ``i`` and ``ḡ`` their mean:

    total variance     tr Var[g]  ≈  (1/(N-1)) Σ_i ||g_i - ḡ||²
    signal             ||E g||²   ≈  ||ḡ||² - tr Var[g] / N          (unbiased)
    relative variance  tr Var[g] / ||E g||²                         (1 / SNR, scale-free)

Estimators of the same objective (PKPO-style pass@K and MaxPO are both unbiased for the pass@K
gradient) are compared by their total variance; estimators of different objectives or scales
(GRPO's std-normalised advantages) by the relative variance. The cosine between two arms' mean
gradients says whether they estimate the same direction.
"""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from posttrain_jax import methods as methods_lib
from posttrain_jax import objectives, rollout
from posttrain_jax.sweeps.reproduce import load_config_module
from posttrain_jax.train import generation, updates


@dataclasses.dataclass
class _Moments:
  """Running sums of the flattened gradients of one arm."""

  total: np.ndarray
  sq_norms: list

  def add(self, g: np.ndarray) -> None:
    self.total += g
    self.sq_norms.append(float(g @ g))

  @property
  def mean(self) -> np.ndarray:
    return self.total / len(self.sq_norms)

  def summary(self) -> dict:
    """Total variance (sum of per-coordinate sample variances, ddof 1), the unbiased
    ||E g||², their ratio, and the mean gradient norm."""
    n = len(self.sq_norms)
    mean_sq = float(self.mean @ self.mean)
    trace_var = (float(np.mean(self.sq_norms)) - mean_sq) * n / (n - 1)
    signal = mean_sq - trace_var / n
    return {
      "grad_norm_mean": float(np.mean(np.sqrt(self.sq_norms))),
      "total_variance": trace_var,
      "signal": signal,
      "relative_variance": trace_var / signal if signal > 0 else float("inf"),
    }


def moments(size: int) -> _Moments:
  """Empty running sums for flattened gradients of ``size`` entries."""
  return _Moments(np.zeros(size, np.float64), [])


def _gradient_fn(ctx, cfg):
  """Jitted ``(params, tokens, start, mask, adv) -> flat gradient`` of the policy loss at
  ratio 1 (old log-probs are the current ones, stop-gradient)."""
  loss_fn = objectives.lookup(objectives.POLICY_LOSSES, cfg.policy_loss, "policy loss")
  kwargs = dict(cfg.policy_loss_kwargs)

  def loss(params, tokens, start, mask, adv):
    logprobs, _ = updates.sequence_logprobs(
      ctx.graphdef, params, tokens, start, ctx.prompt_len, temperature=cfg.temperature
    )
    return loss_fn(
      logprobs,
      jax.lax.stop_gradient(logprobs),
      adv,
      mask,
      aggregation=cfg.aggregation,
      norm_length=cfg.get("norm_length", None),
      **kwargs,
    )[0]

  return jax.jit(lambda *a: ravel_pytree(jax.grad(loss)(*a))[0])


def measure(
  config_file: str,
  workdir: str,
  *,
  batches: int = 64,
  stage: str = "pretrain",
  seed: int = 0,
  smoke: bool = False,
  key_seed: int = 7,
) -> dict:
  """Gradient statistics of every arm of ``config_file`` at ``workdir``'s ``stage`` params.

  Returns ``{"arms": {arm: {...}}, "cosine": {"a|b": cos}, "reward_mean": ..., ...}``.
  """
  if batches < 2:
    raise ValueError(f"batches must be >= 2 to estimate a variance, got {batches}")
  module = load_config_module(config_file)
  base = module.get_config(f"seed={seed}" + (",smoke" if smoke else ""))
  arms = {
    arm: module.get_config(f"arm={arm},seed={seed}" + (",smoke" if smoke else "")).rl
    for arm in base.sweep.arms
  }
  ctx = methods_lib.make_context(base, workdir)
  if not ctx.is_done(stage):
    raise FileNotFoundError(
      f"no finished {stage!r} stage in {workdir} (no {stage}/done.json); "
      "run the sweep's shared stages first"
    )
  params = ctx.load_final(stage)
  cfg = base.rl
  P, G = cfg.prompts_per_step, cfg.group_size
  sample = rollout.make_sampler(
    ctx.graphdef,
    ctx.sampler_config(
      temperature=cfg.temperature,
      max_new_tokens=cfg.max_new_tokens,
      top_k=cfg.top_k,
      top_p=cfg.top_p,
    ),
  )
  advantage_fns = {
    a: updates.make_advantage_fn(c.advantage, tuple(sorted(dict(c.advantage_kwargs).items())), P)
    for a, c in arms.items()
  }
  grad_fns = {a: _gradient_fn(ctx, c) for a, c in arms.items()}
  size = ravel_pytree(params)[0].shape[0]
  sums = {a: moments(size) for a in arms}
  group = np.repeat(np.arange(P, dtype=np.int32), G)
  key = jax.random.key(key_seed)
  rewards_seen = []
  for i in range(batches):
    k = jax.random.fold_in(key, i)
    problems = ctx.env.sample(jax.random.fold_in(k, 0), P, level=base.env.level, split="train")
    tokens, mask = rollout.encode_prompts(
      ctx.tokenizer, [p.prompt for p in problems], length=ctx.prompt_len
    )
    ro = sample(params, np.repeat(tokens, G, 0), np.repeat(mask, G, 0), jax.random.fold_in(k, 1))
    texts = rollout.decode_completions(ctx.tokenizer, np.asarray(ro.completion))
    rewards, _ = generation.score_texts(ctx, ctx.env, [problems[g] for g in group], texts)
    rewards_seen.append(rewards)
    inputs = objectives.AdvantageInputs(
      rewards=jnp.asarray(rewards),
      group=jnp.asarray(group),
      valid=jnp.ones(rewards.shape, jnp.float32),
      mask=ro.completion_mask,
      logprobs=ro.logprobs,
    )
    for arm in arms:
      adv, _ = advantage_fns[arm](inputs)
      g = grad_fns[arm](params, ro.tokens, ro.start, ro.completion_mask, adv)
      sums[arm].add(np.asarray(g, np.float64))
  out = {
    "config": config_file,
    "workdir": workdir,
    "stage": stage,
    "batches": batches,
    "prompts": P,
    "group_size": G,
    "parameters": int(size),
    "reward_mean": float(np.mean(rewards_seen)),
    "arms": {},
    "cosine": {},
  }
  means = {arm: m.mean for arm, m in sums.items()}
  for arm, m in sums.items():
    out["arms"][arm] = {"advantage": arms[arm].advantage, **m.summary()}
  names = list(arms)
  for i, a in enumerate(names):
    for b in names[i + 1 :]:
      denom = np.linalg.norm(means[a]) * np.linalg.norm(means[b])
      out["cosine"][f"{a}|{b}"] = float(means[a] @ means[b] / denom) if denom else 0.0
  return out


def _ratio(a: float, b: float) -> float:
  return a / b if b > 0 and np.isfinite(b) else float("nan")


def write_report(path: str, results: list[dict], command: str) -> str:
  """Markdown table of :func:`measure` results (one per seed): per arm, mean over seeds."""
  arms = list(results[0]["arms"])
  lines = [
    f"# Gradient variance per advantage estimator ({os.path.basename(results[0]['config'])})",
    "",
    f"{results[0]['batches']} independent batches of {results[0]['prompts']} prompts x "
    f"{results[0]['group_size']} rollouts per seed, every arm on the same rollouts, "
    f"gradient of the policy loss at ratio 1 w.r.t. all {results[0]['parameters']:,} "
    f"parameters at the `{results[0]['stage']}` checkpoint. Relative variance = "
    "tr Var[g] / ||E g||² (1/SNR; lower is better, scale-free); total variance compares "
    "estimators of the same objective.",
    "",
    "| arm | advantage | seed | mean reward | grad norm | total variance | ||E g||² | "
    "relative variance |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for arm in arms:
    for seed, r in enumerate(results):
      a = r["arms"][arm]
      lines.append(
        f"| {arm} | {a['advantage']} | {seed} | {r['reward_mean']:.3f} | "
        f"{a['grad_norm_mean']:.4g} | {a['total_variance']:.4g} | {a['signal']:.4g} "
        f"| {a['relative_variance']:.3g} |"
      )
  lines += [
    "",
    "Mean over seeds of the relative variance, and of each arm's ratio to the first "
    "arm's on the same seed:",
    "",
    f"| arm | relative variance | ratio to {arms[0]} | total variance ratio to {arms[0]} |",
    "|---|---|---|---|",
  ]
  ratio_of = lambda r, arm, key: _ratio(r["arms"][arm][key], r["arms"][arms[0]][key])
  for arm in arms:
    rel = [r["arms"][arm]["relative_variance"] for r in results]
    ratio = [ratio_of(r, arm, "relative_variance") for r in results]
    tot = [ratio_of(r, arm, "total_variance") for r in results]
    lines.append(f"| {arm} | {np.mean(rel):.3g} | {np.mean(ratio):.3g} | {np.mean(tot):.3g} |")
  lines += [
    "",
    "Cosine between arms' mean gradients (per seed): "
    + "; ".join(
      f"{pair}: " + ", ".join(f"{r['cosine'][pair]:.3f}" for r in results)
      for pair in results[0]["cosine"]
    ),
    "",
    f"Command: `{command}`",
    "",
  ]
  text = "\n".join(lines)
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
  with open(os.path.splitext(path)[0] + ".jsonl", "w", encoding="utf-8") as f:
    for r in results:
      f.write(json.dumps(r) + "\n")
  return text
