#!/usr/bin/env python
"""TRL GRPOTrainer on the time-to-target workload: seconds of GRPO until held-out greedy accuracy
first reaches the target, from our exported pretrained checkpoint. CPU.

    .venv/bin/python scripts/bench.py --workload time_to_target --json   # writes the checkpoint
    .venv-trl/bin/python scripts/peers/trl_time_to_target.py \\
        --checkpoint .cache/time_to_target/hf --problems .cache/time_to_target/problems.json

``--problems`` is the ``problems.json`` written next to the checkpoint by
``posttrain_jax.bench.time_to_target.prepare``: the held-out problems (prompt, answer), a pool of
training prompts, and our run's hyperparameters, which this script copies into ``GRPOConfig``
(P prompts x G rollouts, max new tokens, AdamW lr / b1 / b2 / weight decay, clip norm,
temperature, beta, clip epsilon; ``loss_type='dapo'`` (token mean over the batch) and
``scale_rewards='group'``, as our token_mean GRPO). Completions stop at EOS (not forced).

The clock: from ``on_train_begin`` through each ``on_step_end``, stopped while evaluating. Every
``--eval_every`` steps the policy decodes every held-out prompt greedily (``generate`` with
``do_sample=False``, off the clock); training stops at the first evaluation at or above the
highest threshold. Prints ``RESULT {json}`` with one record per seed (the schema of
``time_to_target.run_ours``).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common_tiny as ct  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--checkpoint", required=True, help="the exported Hugging Face folder")
ap.add_argument("--problems", required=True, help="problems.json written next to it")
ap.add_argument("--seeds", default="0,1,2")
ap.add_argument("--thresholds", default="0.6,0.8,0.9")
ap.add_argument("--eval_every", type=int, default=5)
ap.add_argument("--max_steps", type=int, default=300)
ap.add_argument(
  "--max_new",
  type=int,
  default=None,
  help="a generation budget other than problems.json's (answers end at EOS)",
)
args = ap.parse_args()
for path in (args.checkpoint, args.problems):
  if not os.path.exists(path):
    sys.exit(
      f"error: {path} does not exist; write it with "
      "`python scripts/bench.py --workload time_to_target` first"
    )
THRESHOLDS = sorted(float(t) for t in args.thresholds.split(","))
with open(args.problems, encoding="utf-8") as f:
  PROBLEMS = json.load(f)
HP = PROBLEMS["hyperparameters"]
if args.max_new is not None:
  HP["max_new"] = args.max_new

import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

WORK = tempfile.mkdtemp(prefix="peer_trl_ttt_")


def reward_fn(prompts, completions, answer, **kw):
  return [ct.reward(c, a) for c, a in zip(completions, answer)]


@torch.no_grad()
def greedy_accuracy(model, tok) -> float:
  """Greedy accuracy on every held-out problem, one left-padded generate call."""
  was_training = model.training
  model.eval()
  rows = PROBLEMS["heldout"]
  enc = tok(
    [r["prompt"] for r in rows], return_tensors="pt", padding=True, add_special_tokens=False
  )
  out = model.generate(
    **enc,
    max_new_tokens=HP["max_new"],
    do_sample=False,
    pad_token_id=tok.pad_token_id,
    eos_token_id=tok.eos_token_id,
  )
  texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
  model.train(was_training)
  return statistics.fmean(ct.reward(t, r["answer"]) for t, r in zip(texts, rows))


class Race(TrainerCallback):
  """Keeps the GRPO clock (evaluation excluded) and stops at the highest threshold."""

  def __init__(self, tok):
    self.tok, self.clock, self.last, self.curve, self.steps_s, self.eval_s = (
      tok,
      0.0,
      None,
      [],
      [],
      0.0,
    )

  def _evaluate(self, model, step):
    t = time.perf_counter()
    acc = greedy_accuracy(model, self.tok)
    self.eval_s += time.perf_counter() - t
    self.curve.append({"step": step, "seconds": self.clock, "accuracy": acc})
    print(f"step {step}: {self.clock:.2f} s, held-out greedy accuracy {acc:.3f}", flush=True)
    return acc

  def on_train_begin(self, a, s, c, model=None, **k):
    self.begin = time.perf_counter()
    self._evaluate(model, 0)
    self.last = time.perf_counter()

  def on_step_end(self, a, s, c, model=None, **k):
    now = time.perf_counter()
    self.steps_s.append(now - self.last)
    self.clock += now - self.last
    if s.global_step % args.eval_every == 0 or s.global_step >= args.max_steps:
      if self._evaluate(model, s.global_step) >= THRESHOLDS[-1]:
        c.should_training_stop = True
    self.last = time.perf_counter()


def one_run(seed):
  t0 = time.perf_counter()
  torch.manual_seed(seed)
  tok = AutoTokenizer.from_pretrained(args.checkpoint)
  tok.padding_side = "left"
  model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32)
  if HP["beta"] > 0:
    model.config._name_or_path = args.checkpoint
  train = PROBLEMS["train"]
  ds = Dataset.from_dict(
    {"prompt": [r["prompt"] for r in train], "answer": [r["answer"] for r in train]}
  )
  conf = GRPOConfig(
    output_dir=os.path.join(WORK, f"out_{seed}"),
    per_device_train_batch_size=HP["prompts"] * HP["group"],
    gradient_accumulation_steps=1,
    num_generations=HP["group"],
    num_iterations=1,
    max_completion_length=HP["max_new"],
    max_steps=args.max_steps,
    learning_rate=HP["lr"],
    adam_beta1=HP["b1"],
    adam_beta2=HP["b2"],
    weight_decay=HP["weight_decay"],
    max_grad_norm=HP["grad_clip"],
    lr_scheduler_type="constant",
    warmup_steps=0,
    beta=HP["beta"],
    temperature=HP["temperature"],
    top_p=1.0,
    top_k=0,
    epsilon=HP["clip_eps"],
    loss_type="dapo",
    scale_rewards="group",
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    use_cpu=True,
    bf16=False,
    fp16=False,
    seed=seed,
    disable_tqdm=True,
    dataloader_num_workers=0,
  )
  race = Race(tok)
  tr = GRPOTrainer(
    model=model,
    reward_funcs=reward_fn,
    args=conf,
    train_dataset=ds,
    processing_class=tok,
    callbacks=[race],
  )
  setup_s = time.perf_counter() - t0
  tr.train()
  reached = {}
  for t in THRESHOLDS:
    hit = next((p for p in race.curve if p["accuracy"] >= t), None)
    reached[f"{t:g}"] = None if hit is None else {"seconds": hit["seconds"], "step": hit["step"]}
  steady = race.steps_s[2:] or race.steps_s
  return {
    "framework": "trl",
    "seed": seed,
    "target": THRESHOLDS[0],
    "seconds_to_target": (reached[f"{THRESHOLDS[0]:g}"] or {}).get("seconds"),
    "reached": reached,
    "curve": race.curve,
    "start_accuracy": race.curve[0]["accuracy"],
    "steps": len(race.steps_s),
    "setup_s": setup_s,
    "first_iteration_s": race.steps_s[0] if race.steps_s else None,
    "iteration_s": statistics.median(steady) if steady else None,
    "eval_s": race.eval_s,
    "eval_problems": len(PROBLEMS["heldout"]),
    "eval_every": args.eval_every,
    "hyperparameters": HP,
  }


if __name__ == "__main__":
  print(
    f"torch {torch.__version__} transformers {transformers.__version__} trl {trl.__version__} "
    f"threads={torch.get_num_threads()}",
    flush=True,
  )
  records = []
  for seed in (int(s) for s in args.seeds.split(",")):
    records.append(one_run(seed))
    r = records[-1]
    print(
      f"seed {seed}: {r['seconds_to_target']} s to {THRESHOLDS[0]:g} "
      f"(reached {r['reached']}), {r['iteration_s']:.3f} s per step",
      flush=True,
    )
  ct.emit(
    {
      "bench": "trl_time_to_target",
      "peer": "trl",
      "records": records,
      "versions": dict(
        torch=torch.__version__, transformers=transformers.__version__, trl=trl.__version__
      ),
      "threads": torch.get_num_threads(),
    }
  )
