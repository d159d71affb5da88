"""Records TRL's GRPO losses (every ``loss_type``, with and without the KL term) on fixed
float32 inputs: the parity fixtures tests/objectives/test_peer_parity.py compares the library
with (values, and gradients with respect to the current log-probs).

    make peer-trl                                   # .venv-trl (trl 1.16.0, torch 2.13.0 CPU)
    .venv-trl/bin/python scripts/peers/record_trl_parity.py

TRL computes its losses inside ``GRPOTrainer._compute_loss(self, model, inputs)``; the script
calls that method on a stand-in ``self`` whose ``_get_per_token_logps_and_entropies`` returns
the fixture's log-probs, so the numbers are TRL's own code's. TRL's advantages are computed
inline in ``_generate_and_score_completions`` (no function to call), so only the losses are
recorded. The installed TRL version must be the pinned one. It does not import posttrain_jax.
"""

import argparse
import collections
import json
import pathlib
import sys
import types

import numpy as np

PIN = "1.16.0"
OUT = pathlib.Path(__file__).resolve().parents[2] / "tests/objectives/parity/trl_1.16.0.json"
B, T = 8, 6


def _inputs(seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  lengths = np.array([6, 3, 5, 1, 4, 6, 2, 5])
  mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
  old = np.log(rng.uniform(0.05, 0.9, size=(B, T))).astype(np.float32)
  return {
    "mask": mask,
    "old_logprobs": old,
    "logprobs": (old + rng.normal(scale=0.6, size=(B, T))).astype(np.float32),
    "ref_logprobs": (old + rng.normal(scale=0.5, size=(B, T))).astype(np.float32),
    "advantages": rng.normal(size=B).astype(np.float32),
  }


def _stand_in(trainer_cls, torch, *, loss_type, level="token", beta=0.0, eps=(0.2, 0.2), **args):
  """A ``self`` with what ``_compute_loss`` reads: one process, no accumulation, no vLLM."""
  logps = {}

  def per_token(model, input_ids, attention_mask, logits_to_keep, **kw):
    return logps["tensor"], torch.zeros_like(logps["tensor"]), None

  identity = lambda x, **kw: x
  accel = types.SimpleNamespace(
    num_processes=1, gather=identity, gather_for_metrics=identity, reduce=identity
  )
  accel.sync_gradients = True
  defaults = dict(
    delta=None,
    use_bias_correction_kl=True,  # TRL's default: the KL times the ratio to the old policy
    sapo_temperature_pos=1.0,
    sapo_temperature_neg=1.05,
    vespo_k_pos=2.0,
    vespo_lambda_pos=3.0,
    vespo_k_neg=3.0,
    vespo_lambda_neg=2.0,
    steps_per_generation=1,
  )
  me = types.SimpleNamespace(
    _get_per_token_logps_and_entropies=per_token,
    top_entropy_quantile=1.0,
    aux_loss_enabled=False,
    off_policy_mask_threshold=None,
    importance_sampling_level=level,
    beta=beta,
    loss_type=loss_type,
    epsilon_low=eps[0],
    epsilon_high=eps[1],
    use_vllm=False,
    vllm_importance_sampling_correction=False,
    model=types.SimpleNamespace(training=True),
    current_gradient_accumulation_steps=1,
    accelerator=accel,
    max_completion_length=T,
    _entropy_bonus_enabled=False,
    _metrics={"train": collections.defaultdict(list), "eval": collections.defaultdict(list)},
    args=types.SimpleNamespace(**{**defaults, **args}),
    get_gamma_weights=trainer_cls.get_gamma_weights,
    get_off_policy_mask=trainer_cls.get_off_policy_mask,
  )
  return me, logps


# name -> (loss_type, importance_sampling_level, beta, (epsilon_low, epsilon_high), args)
CASES = {
  "grpo": ("grpo", "token", 0.0, (0.2, 0.2), {}),
  "grpo/kl": ("grpo", "token", 0.04, (0.2, 0.2), {}),
  "grpo/delta": ("grpo", "token", 0.0, (0.2, 0.28), {"delta": 1.5}),
  "grpo/sequence": ("grpo", "sequence", 0.0, (3e-4, 4e-4), {}),
  "bnpo/kl": ("bnpo", "token", 0.04, (0.2, 0.2), {}),
  "bnpo/kl_uncorrected": ("bnpo", "token", 0.04, (0.2, 0.2), {"use_bias_correction_kl": False}),
  "dr_grpo": ("dr_grpo", "token", 0.0, (0.2, 0.2), {}),
  "dr_grpo/kl": ("dr_grpo", "token", 0.04, (0.2, 0.2), {}),
  "dapo": ("dapo", "token", 0.0, (0.2, 0.28), {}),
  "cispo": ("cispo", "token", 0.0, (0.2, 5.0), {}),
  "sapo": ("sapo", "token", 0.0, (0.2, 0.2), {}),
  "luspo": ("luspo", "sequence", 0.0, (3e-4, 4e-4), {}),
  "vespo": ("vespo", "token", 0.0, (0.2, 0.2), {}),
}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=str(OUT))
  args = parser.parse_args()
  import torch
  import trl
  from trl import GRPOTrainer

  if trl.__version__ != PIN:
    sys.exit(f"trl {trl.__version__} is installed; the fixtures pin {PIN} (make peer-trl)")
  x = _inputs()
  t = lambda a: torch.tensor(np.asarray(a))
  mask = t(x["mask"])
  inputs = {
    "prompt_ids": torch.zeros((B, 2), dtype=torch.long),
    "prompt_mask": torch.ones((B, 2), dtype=torch.long),
    "completion_ids": torch.zeros((B, T), dtype=torch.long),
    "completion_mask": mask,
    "advantages": t(x["advantages"]),
    "old_per_token_logps": t(x["old_logprobs"]),
    "ref_per_token_logps": t(x["ref_logprobs"]),
    "num_items_in_batch": mask.sum(),
  }
  cases = {}
  for name, (loss_type, level, beta, eps, extra) in CASES.items():
    me, logps = _stand_in(
      GRPOTrainer, torch, loss_type=loss_type, level=level, beta=beta, eps=eps, **extra
    )
    logps["tensor"] = t(x["logprobs"]).requires_grad_(True)
    loss = GRPOTrainer._compute_loss(me, None, dict(inputs))
    loss.backward()
    cases[name] = {
      "loss_type": loss_type,
      "importance_sampling_level": level,
      "beta": beta,
      "epsilon": list(eps),
      "args": extra,
      "value": float(loss.detach().double()),
      "grad": logps["tensor"].grad.double().numpy().tolist(),
    }
  doc = {
    "peer": "huggingface/trl",
    "version": trl.__version__,
    "torch": torch.__version__,
    "recorded_by": "scripts/peers/record_trl_parity.py",
    "inputs": {k: np.asarray(v).tolist() for k, v in x.items()},
    "cases": cases,
  }
  pathlib.Path(args.out).write_text(json.dumps(doc, sort_keys=True) + "\n")
  print(f"wrote {len(cases)} cases to {args.out}")


if __name__ == "__main__":
  main()
