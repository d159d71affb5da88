"""Records verl's advantages, policy losses, value loss, KL estimators and entropy on fixed
float32 inputs: the parity fixtures that tests/objectives/test_peer_parity.py compares the
library with (values, and gradients with respect to the current log-probs).

    make peer-verl                                             # .venv-verl (torch 2.13.0 CPU)
    git clone https://github.com/volcengine/verl /tmp/verl && git -C /tmp/verl checkout b178a3c
    .venv-verl/bin/python scripts/peers/record_verl_parity.py --verl-src /tmp/verl

The pin is checked: the script refuses a checkout whose core_algos.py or torch_functional.py
differs from the pinned commit's (their sha256 below). Nothing of verl is copied into the
project; the fixture holds only inputs and verl's outputs, as numbers. It does not import
posttrain_jax (the peer venv does not have it).
"""

import argparse
import hashlib
import json
import pathlib
import sys

import numpy as np

COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"
SHA256 = {  # of the pinned commit's files
  "verl/trainer/ppo/core_algos.py": "fadfafa83d94ba40d7ac2abeedb6e99ea0716b42f8744c421ecbb371db8b4d24",
  "verl/utils/torch_functional.py": "8ac62195a800ba784d1cddf03ee0bc7627f20236cc11e135fdba20e8d4a01f14",
}
OUT = pathlib.Path(__file__).resolve().parents[2] / "tests/objectives/parity/verl_b178a3c.json"
B, T = 10, 6
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _inputs(seed: int = 0) -> dict:
  """Ragged right-padded masks (lengths 1..T), groups of 4, 3 and 3, float32 everything."""
  rng = np.random.default_rng(seed)
  lengths = np.array([6, 3, 5, 1, 4, 6, 2, 5, 6, 3])
  mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
  group = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
  scores = rng.normal(size=B).astype(np.float32)
  binary = np.array([1, 0, 1, 1, 0, 0, 0, 1, 0, 1], np.float32)  # group 1 all 0 (flat)
  old = np.log(rng.uniform(0.05, 0.9, size=(B, T))).astype(np.float32)
  new = (old + rng.normal(scale=0.8, size=(B, T))).astype(np.float32)
  adv = rng.normal(size=B).astype(np.float32)
  ref = (new + rng.normal(scale=1.0, size=(B, T))).astype(np.float32)
  ref[0, 0] = new[0, 0] + 3.5  # k3 = e^3.5 - 4.5 ≈ 28.6: beyond verl's clamp at 10
  token_rewards = (rng.normal(size=(B, T)) * (rng.random((B, T)) < 0.4)).astype(np.float32)
  return {
    "mask": mask,
    "lengths": lengths.astype(np.float32),
    "group": group,
    "scores": scores,
    "binary_scores": binary,
    "baseline": rng.normal(size=B).astype(np.float32),
    "token_rewards": token_rewards * mask,
    "values": rng.normal(size=(B, T)).astype(np.float32),
    "vpreds": rng.normal(size=(B, T)).astype(np.float32),
    "returns": rng.normal(size=(B, T)).astype(np.float32),
    "old_logprobs": old,
    "logprobs": new,
    "advantages": adv,
    "ref_logprobs": ref,
    "logits": rng.normal(size=(B, T, 7)).astype(np.float32),
  }


def _extreme(log_ratio: float, sign: float) -> dict:
  """Row 0's first token at the given log-ratio, advantages of the given sign."""
  x = _inputs(1)
  x["logprobs"] = x["old_logprobs"].copy()
  x["logprobs"][:, 0] += np.float32(log_ratio)
  x["advantages"] = (sign * np.abs(x["advantages"])).astype(np.float32)
  return x


def _holed(x: dict) -> dict:
  """The same inputs with holes inside some rows' masks (a tool's output between two turns)."""
  x = dict(x)
  mask = x["mask"].copy()
  mask[0, 2:4] = 0.0
  mask[2, 1] = 0.0
  mask[5, 3] = 0.0
  mask[8, 1:3] = 0.0
  x["mask"] = mask
  x["token_rewards"] = x["token_rewards"] * mask
  return x


def _outcome(scores, mask):
  """[B, T] token-level rewards with each row's score on its last token (verl's layout)."""
  out = np.zeros(mask.shape, np.float32)
  out[np.arange(mask.shape[0]), mask.sum(-1).astype(int) - 1] = scores
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--verl-src", required=True, help="a checkout of volcengine/verl at the pin")
  parser.add_argument("--out", default=str(OUT))
  args = parser.parse_args()
  src = pathlib.Path(args.verl_src).resolve()
  for rel, want in SHA256.items():
    got = hashlib.sha256((src / rel).read_bytes()).hexdigest()
    if got != want:
      sys.exit(
        f"{src / rel} is not the pinned commit's ({COMMIT[:7]}): sha256 {got}; check out {COMMIT}"
      )
  sys.path.insert(0, str(src))
  import torch
  from verl.trainer.ppo import core_algos as ca
  from verl.workers.config import ActorConfig

  t = lambda a: torch.tensor(np.asarray(a))
  cases = {}

  def record(name, fn, inputs, kwargs, *, grad_of=None):
    """Calls fn(**tensors, **kwargs); records the first output (and d/d ``grad_of``)."""
    tensors = {k: t(v) for k, v in inputs.items()}
    if grad_of:
      tensors[grad_of].requires_grad_(True)
    out = fn(**tensors, **kwargs)
    value = out[0] if isinstance(out, tuple) else out
    entry = {"value": value.detach().double().numpy().tolist()}
    if grad_of:
      value.sum().backward()
      entry["grad"] = tensors[grad_of].grad.double().numpy().tolist()
    cases[name] = entry

  x = _inputs()
  mask, group = x["mask"], x["group"]
  outcome = {"token_level_rewards": _outcome(x["scores"], mask), "response_mask": mask}
  record("adv/grpo", ca.compute_grpo_outcome_advantage, outcome, {"index": group})
  record(
    "adv/dr_grpo",
    ca.compute_grpo_outcome_advantage,
    outcome,
    {"index": group, "norm_adv_by_std_in_grpo": False},
  )
  record("adv/rloo", ca.compute_rloo_outcome_advantage, outcome, {"index": group})
  record("adv/opo", ca.compute_opo_outcome_advantage, outcome, {"index": group})
  binary = {"token_level_rewards": _outcome(x["binary_scores"], mask), "response_mask": mask}
  record("adv/gpg", ca.compute_gpg_outcome_advantage, binary, {"index": group})
  record(
    "adv/reinforce_pp_baseline",
    ca.compute_reinforce_plus_plus_baseline_outcome_advantage,
    outcome,
    {"index": group},
  )
  cfg = lambda gamma: type("AlgoConfig", (), {"gamma": gamma})()
  record(
    "adv/reinforce_pp",
    ca.compute_reinforce_plus_plus_outcome_advantage,
    outcome,
    {"config": cfg(1.0)},
  )
  tokens = {"token_level_rewards": x["token_rewards"], "response_mask": mask}
  record(
    "adv/reinforce_pp_token",
    ca.compute_reinforce_plus_plus_outcome_advantage,
    tokens,
    {"config": cfg(0.9)},
  )
  record(
    "adv/remax",
    ca.compute_remax_outcome_advantage,
    {**outcome, "reward_baselines": x["baseline"]},
    {},
  )
  record(
    "adv/gae",
    ca.compute_gae_advantage_return,
    {**tokens, "values": x["values"]},
    {"gamma": 0.9, "lam": 0.95},
  )

  holed = _holed(x)
  hm = holed["mask"]
  record(
    "adv/gae/holed",
    ca.compute_gae_advantage_return,
    {"token_level_rewards": holed["token_rewards"], "response_mask": hm, "values": x["values"]},
    {"gamma": 0.9, "lam": 0.95},
  )
  record(
    "adv/reinforce_pp_token/holed",
    ca.compute_reinforce_plus_plus_outcome_advantage,
    {"token_level_rewards": holed["token_rewards"], "response_mask": hm},
    {"config": cfg(0.9)},
  )

  def actor(**kw):
    return ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=1, **kw)

  def loss_inputs(x):
    adv = np.broadcast_to(x["advantages"][:, None], mask.shape).astype(np.float32)
    return {
      "old_log_prob": x["old_logprobs"],
      "log_prob": x["logprobs"],
      "advantages": adv,
      "response_mask": x["mask"],
    }

  losses = loss_inputs(x)
  vanilla = ca.get_policy_loss_fn("vanilla")
  for mode in AGG_MODES:
    kw = {"loss_agg_mode": mode, "config": actor(clip_ratio=0.2)}
    record(f"loss/ppo_clip/{mode}", vanilla, losses, kw, grad_of="log_prob")
  kw = {"loss_agg_mode": "seq-mean-token-mean", "config": actor(clip_ratio=0.2)}
  record("loss/ppo_clip/holed", vanilla, loss_inputs(holed), kw, grad_of="log_prob")
  for log_ratio in (25.0, 100.0, -100.0):
    for sign in (1.0, -1.0):
      kw = {"loss_agg_mode": "token-mean", "config": actor(clip_ratio=0.2)}
      name = f"loss/ppo_clip/extreme/{log_ratio:+g}/{sign:+g}"
      record(name, vanilla, loss_inputs(_extreme(log_ratio, sign)), kw, grad_of="log_prob")
  gspo_cfg = actor(clip_ratio=0.2, clip_ratio_low=3e-4, clip_ratio_high=4e-4)
  record(
    "loss/gspo", ca.get_policy_loss_fn("gspo"), losses, {"config": gspo_cfg}, grad_of="log_prob"
  )
  far = loss_inputs(x)
  far["log_prob"] = far["old_log_prob"] + np.float32(12.0)  # every sequence beyond log s = 10
  far["advantages"] = -np.abs(far["advantages"])
  record(
    "loss/gspo/clamped",
    ca.get_policy_loss_fn("gspo"),
    far,
    {"config": gspo_cfg},
    grad_of="log_prob",
  )
  record(
    "loss/sapo", ca.get_policy_loss_fn("sapo"), losses, {"config": actor()}, grad_of="log_prob"
  )
  cispo_cfg = actor(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28)
  record(
    "loss/cispo", ca.get_policy_loss_fn("cispo"), losses, {"config": cispo_cfg}, grad_of="log_prob"
  )
  record("loss/gpg", ca.get_policy_loss_fn("gpg"), losses, {"config": actor()}, grad_of="log_prob")
  gmpo_cfg = actor(clip_ratio=0.4, clip_ratio_low=0.4, clip_ratio_high=0.4)
  record(
    "loss/gmpo", ca.get_policy_loss_fn("geo_mean"), losses, {"config": gmpo_cfg}, grad_of="log_prob"
  )
  from verl.workers.config import PolicyLossConfig

  # clip_cov_ratio = 1: every band token is taken out, so verl's random draw takes them all.
  cov = PolicyLossConfig(clip_cov_ratio=1.0, clip_cov_lb=0.05, kl_cov_ratio=0.1, ppo_kl_coef=1.0)
  cov_cfg = actor(clip_ratio=0.2, policy_loss=cov)
  record(
    "loss/clip_cov",
    ca.get_policy_loss_fn("clip_cov"),
    losses,
    {"config": cov_cfg},
    grad_of="log_prob",
  )
  record(
    "loss/kl_cov", ca.get_policy_loss_fn("kl_cov"), losses, {"config": cov_cfg}, grad_of="log_prob"
  )
  record(
    "loss/value",
    ca.compute_value_loss,
    {"vpreds": x["vpreds"], "returns": x["returns"], "values": x["values"], "response_mask": mask},
    {"cliprange_value": 0.2},
    grad_of="vpreds",
  )
  for est in ("k1", "k2", "k3", "abs", "k1+", "k3+"):
    if est.endswith("+"):  # at the pin, kl_penalty_forward does not know the "+" names
      try:
        ca.kl_penalty(t(x["logprobs"]), t(x["ref_logprobs"]), est)
      except NotImplementedError:
        cases[f"kl/{est}"] = {"error": "NotImplementedError"}
        continue
    record(
      f"kl/{est}",
      ca.kl_penalty,
      {"logprob": x["logprobs"], "ref_logprob": x["ref_logprobs"]},
      {"kl_penalty": est},
      grad_of="logprob",
    )
  record(
    "entropy",
    ca.compute_entropy_loss,
    {"logits": x["logits"], "response_mask": mask},
    {},
    grad_of="logits",
  )
  listed = lambda d: {k: np.asarray(v).tolist() for k, v in d.items()}
  extremes = {
    f"{lr:+g}/{s:+g}": listed(_extreme(lr, s)) for lr in (25.0, 100.0, -100.0) for s in (1.0, -1.0)
  }
  doc = {
    "peer": "volcengine/verl",
    "commit": COMMIT,
    "files_sha256": SHA256,
    "torch": torch.__version__,
    "recorded_by": "scripts/peers/record_verl_parity.py",
    "inputs": listed(x),
    "holed_mask": holed["mask"].tolist(),
    "extreme_inputs": extremes,
    "cases": cases,
  }
  pathlib.Path(args.out).write_text(json.dumps(doc, indent=0, sort_keys=True) + "\n")
  print(f"wrote {len(cases)} cases to {args.out}")


if __name__ == "__main__":
  main()
