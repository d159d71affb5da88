r"""GRPO on one of our environments from a local Hugging Face checkpoint: the path for real models.

    python -m posttrain_jax.main --config=experiments/hf_grpo.py:path=/models/Qwen3-0.6B \
        --workdir=runs/qwen3 --config.mesh.shape='(1,-1,1)'
    python scripts/export_hf.py runs/qwen3 /models/Qwen3-0.6B-grpo     # the RL result, HF format

``path`` is a folder saved by transformers' ``save_pretrained`` (config.json, safetensors, the
tokenizer files): Qwen2 / Qwen2.5 / Qwen3 / Qwen3-MoE / Llama 3 / Mixtral. Its weights are
streamed onto the mesh with the trainer's rules, its tokenizer is used (EOS also pads when it has
no pad token), and with ``chat`` every env prompt is wrapped by the folder's chat template. No
pretraining stage: RL then evaluation. Defaults are sized for one GPU and Qwen3-0.6B (see the
README's memory arithmetic); ``smoke`` shrinks everything for a tiny random checkpoint in tests.
Args: ``path=DIR``, ``env=NAME``, ``level=N``, ``chat``, ``seed=N``, ``smoke``.
"""

from posttrain_jax import defaults


def get_config(arg=None):
  args = defaults.parse_arg(
    arg, path="", env="arithmetic", level=3, chat=False, seed=0, smoke=False
  )
  if not args.path:
    raise ValueError(
      "experiments/hf_grpo.py needs the checkpoint folder: --config=experiments/hf_grpo.py:path=DIR"
    )
  c = defaults.base_config()
  c.seed = args.seed
  c.stages = ("rl", "eval")
  c.env.name, c.env.level = args.env, args.level
  c.model.update(hf_path=args.path, chat_template=args.chat, dtype="bfloat16", remat=True)
  c.rl.update(
    steps=200,
    prompts_per_step=16,
    group_size=8,
    lr=1e-6,
    max_new_tokens=64,
    temperature=1.0,
    kl_coef=0.0,
    eval_every=25,
    eval_problems=200,
    sampler_precision="bfloat16",
    minibatches=4,
  )
  c.eval.update(num_problems=500, batch_size=64, pass_k=4, pass_n=8, pass_problems=100)
  if args.smoke:
    c.model.update(dtype="float32", remat=False)
    c.tensorboard = False
    c.rl.update(
      steps=2,
      prompts_per_step=2,
      group_size=4,
      lr=1e-4,
      max_new_tokens=6,
      eval_every=1,
      eval_problems=8,
      checkpoint_every=2,
      minibatches=1,
      sampler_precision="float32",
    )
    c.eval.update(num_problems=8, batch_size=8, pass_k=2, pass_n=4, pass_problems=4)
  return c
