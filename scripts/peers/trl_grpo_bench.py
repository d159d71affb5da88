#!/usr/bin/env python
"""TRL GRPOTrainer (PyTorch) on the benchmark workloads: random-init Qwen2, our character tokenizer,
3-digit addition prompts, no downloads. CPU.

    .venv-trl/bin/python scripts/peers/trl_grpo_bench.py --workload tiny --steps 10 --repeats 3
    .venv-trl/bin/python scripts/peers/trl_grpo_bench.py --workload tiny --max_new 256 --group 16

One iteration = one optimizer step = generate prompts x G completions of exactly max_new tokens
(`min_new_tokens` masks EOS until then), score them, one AdamW step (one epoch, one minibatch:
per_device_train_batch_size = prompts x G, steps_per_generation = gradient_accumulation_steps = 1).
Timed between consecutive `on_step_end` callbacks (the first from `on_train_begin`).

Peer differences (noted, not fixable from outside): HF Qwen2 has q/k/v biases (ours: none in the
`tiny` preset; ~1k parameters); TRL's default loss_type/normalisation, not ours (same cost).
With beta > 0 TRL builds its reference model by reloading `config._name_or_path`, so the random
init is saved to a temporary folder first.
"""

import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common_tiny as ct  # noqa: E402

args = ct.parse_args(__doc__.splitlines()[0], grpo=True, default_steps=6)

import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

M = args.model
tok = ct.build_hf_tokenizer()
rows = ct.make_problems(max(4000, args.prompts * (args.steps + 2)))
WORK = tempfile.mkdtemp(prefix="peer_trl_")


def reward_fn(prompts, completions, answer, **kw):
  return [ct.reward(c, a) for c, a in zip(completions, answer)]


class StepTimer(TrainerCallback):
  def __init__(self):
    self.t, self.last, self.lengths = [], None, []

  def on_train_begin(self, a, s, c, **k):
    self.last = time.perf_counter()

  def on_step_end(self, a, s, c, **k):
    now = time.perf_counter()
    self.t.append(now - self.last)
    self.last = now

  def on_log(self, a, s, c, logs=None, **k):
    if logs and "completions/mean_length" in logs:
      self.lengths.append(
        (
          logs["completions/min_length"],
          logs["completions/mean_length"],
          logs["completions/max_length"],
        )
      )


def make_model(seed):
  torch.manual_seed(seed)
  cfg = Qwen2Config(
    vocab_size=len(tok),
    hidden_size=M["hidden"],
    num_hidden_layers=M["layers"],
    num_attention_heads=M["heads"],
    num_key_value_heads=M["kv_heads"],
    head_dim=M["head_dim"],
    intermediate_size=M["mlp"],
    max_position_embeddings=max(256, ct.PROMPT_LEN + args.max_new + 8),
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    pad_token_id=tok.pad_token_id,
    eos_token_id=tok.eos_token_id,
    bos_token_id=None,
    dtype=torch.float32,
  )
  model = Qwen2ForCausalLM(cfg).to(torch.float32)
  model.generation_config.pad_token_id = tok.pad_token_id
  model.generation_config.eos_token_id = tok.eos_token_id
  return model


def one_run(seed):
  model = make_model(seed)
  if args.beta > 0:
    path = os.path.join(WORK, f"init_seed{seed}")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    model.config._name_or_path = path
  ds = Dataset.from_dict({"prompt": [p for p, _ in rows], "answer": [a for _, a in rows]})
  conf = GRPOConfig(
    output_dir=os.path.join(WORK, f"out_{seed}"),
    per_device_train_batch_size=args.prompts * args.group,
    gradient_accumulation_steps=1,
    num_generations=args.group,
    num_iterations=1,
    max_completion_length=args.max_new,
    max_steps=args.steps,
    learning_rate=ct.LR,
    adam_beta2=ct.B2,
    weight_decay=ct.WEIGHT_DECAY,
    max_grad_norm=ct.GRAD_CLIP,
    lr_scheduler_type="constant",
    warmup_steps=0,
    beta=args.beta,
    temperature=ct.TEMPERATURE,
    top_p=1.0,
    top_k=0,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    use_cpu=True,
    bf16=False,
    fp16=False,
    seed=seed,
    disable_tqdm=True,
    dataloader_num_workers=0,
    generation_kwargs=None if args.allow_eos else {"min_new_tokens": args.max_new},
  )
  timer = StepTimer()
  tr = GRPOTrainer(
    model=model,
    reward_funcs=reward_fn,
    args=conf,
    train_dataset=ds,
    processing_class=tok,
    callbacks=[timer],
  )
  assert next(tr.model.parameters()).dtype == torch.float32
  tr.train()
  return timer.t, timer.lengths


if __name__ == "__main__":
  nparams = sum(p.numel() for p in make_model(0).parameters())
  print(
    f"torch {torch.__version__} transformers {transformers.__version__} trl {trl.__version__} "
    f"threads={torch.get_num_threads()} nparams={nparams} vocab={len(tok)}",
    flush=True,
  )
  runs, lengths = [], []
  for r in range(args.repeats):
    t, lens = one_run(seed=r)
    runs.append(t)
    lengths += lens
    print(
      f"run {r}: step seconds {[round(x, 3) for x in t]}; completion tokens (min, mean, max) "
      f"per step {lens}",
      flush=True,
    )
  res = dict(
    bench="trl_grpo",
    peer="trl",
    **ct.workload_fields(args, grpo=True),
    nparams=nparams,
    completion_tokens=dict(
      min=min(l[0] for l in lengths),
      mean=sum(l[1] for l in lengths) / len(lengths),
      max=max(l[2] for l in lengths),
    ),
    versions=dict(
      torch=torch.__version__, transformers=transformers.__version__, trl=trl.__version__
    ),
    threads=torch.get_num_threads(),
    **ct.summarize(runs),
  )
  ct.emit(res)
