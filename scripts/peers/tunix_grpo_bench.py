#!/usr/bin/env python
"""tunix GRPO (tunix.rl.grpo, JAX) on the benchmark workloads: random-init tunix Qwen2, our character
tokenizer, 3-digit addition prompts, no downloads. CPU.

    .venv-tunix/bin/python scripts/peers/tunix_grpo_bench.py --workload tiny --steps 10 --repeats 3
    .venv-tunix/bin/python scripts/peers/tunix_grpo_bench.py --workload tiny --max_new 256 --group 16

One iteration = one global step of GRPOLearner.train: the vanilla (jitted prefill + decode) sampler
generates prompts x G completions, rewards, one AdamW step (num_iterations 1, one minibatch).
Timed from the start of one `_run_global_step` to the start of the next (the last one to the
trainer's `close()`), so weight sync and metric export between steps are counted; the actor's
parameters are blocked on at the end of each step. The first iteration holds the jit compilation.

Peer limitations (noted, not fixable from outside):
* tunix's sampler has no `min_new_tokens`: the length is forced by giving it an EOS id outside
  the vocabulary, so no completion can stop before max_new tokens (the model may still sample the
  real <eos> id mid-sequence, which tunix then treats as an ordinary token). Same compute as ours.
* tunix's GRPO masks completion tokens equal to <pad> (id 0) if the model samples them; the
  compute is unchanged (fixed shapes).
* tunix's rollout reuses one seed unless told otherwise: RolloutConfig.seed is set per step here.
* tunix Qwen2 has q/k/v biases (ours: none in the `tiny` preset; ~1k parameters).
* jax>=0.9 `make_mesh` defaults to Explicit axes; tunix models need Auto axes.
"""

import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common_tiny as ct  # noqa: E402

args = ct.parse_args(__doc__.splitlines()[0], grpo=True, default_steps=6)

from importlib.metadata import version  # noqa: E402

import grain.python as grain  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from tunix.models.dummy_model_creator import create_dummy_model  # noqa: E402
from tunix.models.qwen2 import model as qwen2_lib  # noqa: E402
from tunix.rl import rl_cluster as rl_cluster_lib  # noqa: E402
from tunix.rl.grpo import grpo_learner as grpo_lib  # noqa: E402
from tunix.rl.rollout import base_rollout  # noqa: E402

M = args.model
tok = ct.build_hf_tokenizer()
rows = ct.make_problems(max(4000, args.prompts * (args.steps + 2)))
KV_CACHE = ct.PROMPT_LEN + args.max_new + 8


def reward_fn(prompts, completions, answer, **kw):
  return [ct.reward(c, str(a)) for c, a in zip(completions, answer)]


class Src(grain.RandomAccessDataSource):
  def __init__(self, rows):
    self.rows = rows

  def __getitem__(self, i):
    return {"prompts": self.rows[i][0], "answer": self.rows[i][1]}

  def __len__(self):
    return len(self.rows)


def model_config():
  return qwen2_lib.ModelConfig(
    vocab_size=len(tok),
    num_layers=M["layers"],
    embed_dim=M["hidden"],
    hidden_dim=M["mlp"],
    num_heads=M["heads"],
    head_dim=M["head_dim"],
    num_kv_heads=M["kv_heads"],
    rope_theta=10000,
    norm_eps=1e-6,
    use_tied_embedding=True,
  )


def one_run(seed):
  mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  cfg = model_config()
  # tunix's random-weight helper, N(0, 0.02) like HF's initializer_range (fp32 parameters).
  actor = create_dummy_model(qwen2_lib.Qwen2, cfg, mesh=mesh, random_seed=seed, scale=0.02)
  ref = (
    create_dummy_model(qwen2_lib.Qwen2, cfg, mesh=mesh, random_seed=seed, scale=0.02)
    if args.beta > 0
    else None
  )
  dtypes = {x.dtype for x in jax.tree.leaves(nnx.state(actor, nnx.Param))}
  assert dtypes == {jnp.dtype("float32")}, dtypes
  rollout_config = base_rollout.RolloutConfig(
    max_tokens_to_generate=args.max_new,
    max_prompt_length=ct.PROMPT_LEN,
    kv_cache_size=KV_CACHE,
    temperature=ct.TEMPERATURE,
    top_p=1.0,
    top_k=None,
    seed=jax.random.PRNGKey(1000 * seed),
    eos_tokens=[tok.eos_token_id] if args.allow_eos else [len(tok) + 7],
  )
  optimizer = optax.chain(
    optax.clip_by_global_norm(ct.GRAD_CLIP),
    optax.adamw(ct.LR, b2=ct.B2, weight_decay=ct.WEIGHT_DECAY),
  )
  cluster_config = rl_cluster_lib.ClusterConfig(
    role_to_mesh={
      rl_cluster_lib.Role.ACTOR: mesh,
      rl_cluster_lib.Role.REFERENCE: mesh,
      rl_cluster_lib.Role.ROLLOUT: mesh,
    },
    rollout_engine="vanilla",
    offload_to_cpu=False,
    training_config=rl_cluster_lib.RLTrainingConfig(
      actor_optimizer=optimizer, eval_every_n_steps=10_000, max_steps=args.steps
    ),
    rollout_config=rollout_config,
  )
  cluster = rl_cluster_lib.RLCluster(
    actor=actor, reference=ref, tokenizer=tok, cluster_config=cluster_config
  )
  learner = grpo_lib.GRPOLearner(
    rl_cluster=cluster,
    reward_fns=[reward_fn],
    algo_config=grpo_lib.GRPOConfig(num_generations=args.group, num_iterations=1, beta=args.beta),
  )

  starts, lengths = [], []
  orig_step, orig_close, orig_generate = learner._run_global_step, cluster.close, cluster.generate

  def timed_step(*a, **k):
    starts.append(time.perf_counter())
    # A fresh rollout key per step (tunix would otherwise reuse PRNGKey(0) every step).
    rollout_config.seed = jax.random.fold_in(jax.random.PRNGKey(1000 * seed), len(starts))
    out = orig_step(*a, **k)
    jax.block_until_ready(nnx.state(actor, nnx.Param))  # the update has finished
    return out

  def timed_close(*a, **k):
    starts.append(time.perf_counter())
    return orig_close(*a, **k)

  def counted_generate(*a, **k):
    out = orig_generate(*a, **k)
    lengths.extend(len(t) for t in out.tokens)
    return out

  learner._run_global_step, cluster.close, cluster.generate = (
    timed_step,
    timed_close,
    counted_generate,
  )
  learner.train(grain.MapDataset.source(Src(rows)).batch(args.prompts))
  return np.diff(starts).tolist(), lengths


if __name__ == "__main__":
  nparams = sum(
    x.size
    for x in jax.tree.leaves(
      nnx.state(
        create_dummy_model(
          qwen2_lib.Qwen2,
          model_config(),
          mesh=jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2),
          random_seed=0,
          scale=0.02,
        ),
        nnx.Param,
      )
    )
  )
  vers = dict(
    jax=jax.__version__,
    flax=version("flax"),
    tunix=version("google-tunix"),
    transformers=version("transformers"),
  )
  print(f"{vers} devices={jax.devices()} nparams={nparams} vocab={len(tok)}", flush=True)
  runs, lengths = [], []
  for r in range(args.repeats):
    t, lens = one_run(r)
    if len(t) != args.steps:
      raise SystemExit(f"expected {args.steps} timed steps, got {len(t)}")
    runs.append(t)
    lengths += lens
    print(
      f"run {r}: step seconds {[round(x, 3) for x in t]}; completions {len(lens)}, tokens "
      f"min/mean/max {min(lens)}/{np.mean(lens):.2f}/{max(lens)}",
      flush=True,
    )
  res = dict(
    bench="tunix_grpo",
    peer="tunix",
    **ct.workload_fields(args, grpo=True),
    nparams=int(nparams),
    completion_tokens=dict(min=min(lengths), mean=float(np.mean(lengths)), max=max(lengths)),
    versions=vers,
    device=str(jax.devices()[0]),
    **ct.summarize(runs),
  )
  ct.emit(res)
