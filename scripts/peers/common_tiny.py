"""Shared by the peer harnesses: the benchmark workloads, the arithmetic task's character
tokenizer and prompts, the command-line interface and the `RESULT {json}` line.

Runs in the peer virtual environments (.venv-trl, .venv-tunix), which do not have posttrain_jax
installed, so nothing here imports it. What is copied from it, to be kept in step by hand:

* the character set ``CHARS`` of ``posttrain_jax.envs.arithmetic``;
* the vocabulary layout of ``posttrain_jax.models.tokenizer.build_char_tokenizer``
  (ids 0, 1, 2 = <pad>, <eos>, <unk>, then one id per sorted character; no BOS): 15 tokens;
* the prompt format of ``Arithmetic.make`` (``f"{a:0{d}d}+{b:0{d}d}="``, 3 digits: 8 tokens)
  and its exact verifier (completion, whitespace-stripped, equals the sum);
* the RL optimiser of ``posttrain_jax.defaults`` (AdamW, lr 1e-4, b2 0.99, no weight decay,
  global-norm clip 1.0), temperature 1, no top-k/top-p.
"""

import argparse
import json
import random
import statistics

CHARS = "0123456789+="  # posttrain_jax.envs.arithmetic.CHARS
PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
LEVEL = 3  # digits per operand: prompts "123+456=" (2 * LEVEL + 2 = 8 tokens)
PROMPT_LEN = 2 * LEVEL + 2

LR, B2, WEIGHT_DECAY, GRAD_CLIP, TEMPERATURE = 1e-4, 0.99, 0.0, 1.0, 1.0

_TINY = dict(hidden=128, layers=4, heads=4, kv_heads=2, head_dim=32, mlp=512)
_SMALL = dict(hidden=512, layers=8, heads=8, kv_heads=4, head_dim=64, mlp=2048)
# Every workload: tied embeddings, fp32, 8 prompts x G rollouts, completions forced to exactly
# max_new tokens (no early EOS), one optimiser step per rollout batch (one epoch, one minibatch).
WORKLOADS = {
  "tiny": dict(model=_TINY, prompts=8, group=8, max_new=16, beta=0.0),
  "small": dict(model=_SMALL, prompts=8, group=8, max_new=128, beta=0.0),
  "tiny_kl": dict(model=_TINY, prompts=8, group=8, max_new=16, beta=0.04),
}


def parse_args(description: str, *, grpo: bool, default_steps: int, extra=None):
  """The shared interface; a workload's defaults are overridden by the flags given."""
  ap = argparse.ArgumentParser(description=description)
  ap.add_argument("--workload", choices=sorted(WORKLOADS), default="tiny")
  ap.add_argument(
    "--max_new",
    type=int,
    default=None,
    help="completion length T, forced (default: the workload's, 16 or 128)",
  )
  ap.add_argument("--group", type=int, default=None, help="rollouts per prompt G (default 8)")
  ap.add_argument("--prompts", type=int, default=None, help="prompts per step (default 8)")
  ap.add_argument(
    "--steps",
    type=int,
    default=default_steps,
    help="timed iterations per run, the first included (and excluded from the stats)",
  )
  ap.add_argument("--repeats", type=int, default=3, help="independent runs (fresh model, seed r)")
  if grpo:
    ap.add_argument(
      "--beta", type=float, default=None, help="KL coefficient (default: the workload's, 0 or 0.04)"
    )
  ap.add_argument(
    "--allow_eos",
    action="store_true",
    help="diagnostic only: let completions stop at EOS (the benchmark forces length)",
  )
  if extra is not None:
    extra(ap)
  args = ap.parse_args()
  wl = WORKLOADS[args.workload]
  args.model = dict(wl["model"])
  for k in ("max_new", "group", "prompts") + (("beta",) if grpo else ()):
    if getattr(args, k) is None:
      setattr(args, k, wl[k])
  if args.steps < 2:
    ap.error("--steps must be >= 2 (the first iteration is excluded from the statistics)")
  if args.group < 1 or args.prompts < 1 or args.max_new < 1 or args.repeats < 1:
    ap.error("--group, --prompts, --max_new and --repeats must be positive")
  return args


def make_problems(n: int, seed: int = 0, level: int = LEVEL):
  """``n`` (prompt, answer) pairs of ``level``-digit addition, as posttrain_jax's arithmetic task."""
  rng = random.Random(seed)
  hi = 10**level
  out = []
  for _ in range(n):
    a, b = rng.randrange(hi), rng.randrange(hi)
    out.append((f"{a:0{level}d}+{b:0{level}d}=", str(a + b)))
  return out


def reward(completion: str, answer: str) -> float:
  """The exact verifier: 1.0 iff the whitespace-stripped completion is the sum."""
  return float(isinstance(completion, str) and completion.strip() == answer)


def build_hf_tokenizer():
  """posttrain_jax's character tokenizer (same ids), built locally with `tokenizers`."""
  import tokenizers
  import transformers
  from tokenizers import decoders, models, pre_tokenizers

  vocab = {PAD: 0, EOS: 1, UNK: 2}
  for ch in sorted(set(CHARS)):
    vocab[ch] = len(vocab)
  tok = tokenizers.Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
  tok.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex(r"[\s\S]"), behavior="isolated")
  tok.decoder = decoders.Fuse()
  hf = transformers.PreTrainedTokenizerFast(
    tokenizer_object=tok,
    pad_token=PAD,
    eos_token=EOS,
    unk_token=UNK,
    padding_side="left",
    clean_up_tokenization_spaces=False,
  )
  assert len(hf) == 15 and hf.pad_token_id == 0 and hf.eos_token_id == 1 and hf.bos_token_id is None
  ids = hf("123+456=", add_special_tokens=False)["input_ids"]
  assert len(ids) == PROMPT_LEN, ids
  return hf


def summarize(runs: list[list[float]]) -> dict:
  """Statistics of the per-iteration seconds of each run, the first iteration of each excluded."""
  steady = [t for run in runs for t in run[1:]]
  return dict(
    median_s=statistics.median(steady),
    min_s=min(steady),
    max_s=max(steady),
    mean_s=statistics.fmean(steady),
    n=len(steady),
    step_s=[round(t, 4) for t in steady],
    first_step_s=[round(run[0], 4) for run in runs],
    run_medians=[round(statistics.median(run[1:]), 4) for run in runs],
    runs_s=[[round(t, 4) for t in run] for run in runs],
  )


def workload_fields(args, *, grpo: bool) -> dict:
  d = dict(
    workload=args.workload,
    model=args.model,
    vocab=15,
    prompt_len=PROMPT_LEN,
    prompts=args.prompts,
    group=args.group,
    batch=args.prompts * args.group,
    max_new=args.max_new,
    forced_length=not args.allow_eos,
    dtype="float32",
    steps=args.steps,
    repeats=args.repeats,
  )
  if grpo:
    d["beta"] = args.beta
  return d


def emit(res: dict) -> None:
  print("RESULT " + json.dumps(res), flush=True)
