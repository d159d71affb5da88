"""Parity with verl and TRL (issue 36): the library's advantages, losses, KL estimators and
entropy against outputs recorded from the peers' own code on fixed float32 inputs: verl's
functions at a pinned commit (tests/objectives/parity/verl_b178a3c.json, written by
scripts/peers/record_verl_parity.py) and TRL's ``GRPOTrainer._compute_loss`` for every
``loss_type`` (tests/objectives/parity/trl_1.16.0.json, scripts/peers/record_trl_parity.py).

Every recorded case is mapped below to the library's call. A case is either ``equal`` (the
library's defaults give verl's values and gradients) or names a ``convention``: the keywords
that switch the library to verl's choice. For those the test asserts both halves: with the
keywords the outputs equal verl's, with the defaults they differ, and docs/reference.md's
"Conventions" section names every keyword. So a convention that silently stops mattering, or
one that is not documented, fails here.
"""

import json
import pathlib
import types
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posttrain_jax import objectives
from posttrain_jax.objectives import (
  covariance,
  group_baselines,
  hysteretic,
  kl,
  ppo_family,
  reductions,
  sequence_level,
  value,
)

HERE = pathlib.Path(__file__).parent
FIXTURE = json.loads((HERE / "parity" / "verl_b178a3c.json").read_text())
TRL = json.loads((HERE / "parity" / "trl_1.16.0.json").read_text())
REFERENCE_MD = (HERE.parents[1] / "docs" / "reference.md").read_text()
RTOL, ATOL = 2e-5, 2e-6


def _arrays(raw: dict) -> dict:
  out = {k: np.asarray(v, np.float32) for k, v in raw.items()}
  out["group"] = np.asarray(raw["group"], np.int32)
  return out


X = _arrays(FIXTURE["inputs"])
MASK = X["mask"]
B, T = MASK.shape
VALID = np.ones(B, np.float32)
P = int(X["group"].max()) + 1


class Case(NamedTuple):
  """``run(**keywords) -> (value, grad or None)``; ``convention``: verl's keywords, or None;
  ``on_mask``: compare on the completion tokens only (verl's GAE leaves its whitened values,
  unused, at padded positions)."""

  run: Callable
  convention: dict | None = None
  on_mask: bool = False


def _rows(adv) -> tuple:
  """verl returns a row advantage tiled over the row's tokens."""
  return np.asarray(adv)[:, None] * MASK, None


def _loss(fn, x=X, grad=True, **fixed):
  """A policy loss on the fixture's inputs: (value, d value / d logprobs)."""

  def run(**kw):
    f = lambda lp: fn(lp, x["old_logprobs"], x["advantages"], x["mask"], **{**fixed, **kw})[0]
    v, g = jax.value_and_grad(f)(jnp.asarray(x["logprobs"]))
    return np.asarray(v), np.asarray(g) if grad else None

  return run


def _kl(name, **fixed):
  def run(**kw):
    fn = lambda lp: objectives.KL_ESTIMATORS[name](lp, X["ref_logprobs"], **{**fixed, **kw})
    out = fn(jnp.asarray(X["logprobs"]))
    g = jax.grad(lambda lp: jnp.sum(fn(lp)))(jnp.asarray(X["logprobs"]))
    return np.asarray(out), np.asarray(g)

  return run


def _entropy():
  f = lambda z: objectives.masked_mean(objectives.entropy_from_logits(z), jnp.asarray(MASK))
  v, g = jax.value_and_grad(f)(jnp.asarray(X["logits"]))
  return np.asarray(v), np.asarray(g)


def _value_loss(**kw):
  f = lambda v: value.clipped_mse(v, X["values"], X["returns"], MASK, clip_eps=0.2, **kw)[0]
  v, g = jax.value_and_grad(f)(jnp.asarray(X["vpreds"]))
  return np.asarray(v), np.asarray(g)


g, s, lengths = X["group"], X["scores"], X["lengths"]
AGG = {
  "token-mean": "token_mean",
  "seq-mean-token-sum": "seq_mean_token_sum",
  "seq-mean-token-mean": "seq_mean_token_mean",
  "seq-mean-token-sum-norm": "seq_mean_token_sum_norm",
}
WHITENING = {"whitening": "unbiased"}
RPP = {"whitening": "unbiased", "weigh": "tokens"}
CASES: dict[str, Case] = {
  "adv/grpo": Case(lambda: _rows(group_baselines.grpo(s, g, VALID, num_groups=P)[0])),
  "adv/dr_grpo": Case(lambda: _rows(group_baselines.dr_grpo(s, g, VALID, num_groups=P)[0])),
  "adv/rloo": Case(lambda: _rows(group_baselines.rloo(s, g, VALID, num_groups=P)[0])),
  "adv/opo": Case(lambda: _rows(group_baselines.opo(s, g, VALID, lengths, num_groups=P)[0])),
  "adv/gpg": Case(
    lambda **kw: _rows(group_baselines.gpg(X["binary_scores"], g, VALID, num_groups=P, **kw)[0]),
    {"alpha": "nonzero_rewards"},
  ),
  "adv/reinforce_pp": Case(
    lambda **kw: _rows(group_baselines.reinforce_pp(s, VALID, lengths=lengths, **kw)[0]), RPP
  ),
  "adv/reinforce_pp_baseline": Case(
    lambda **kw: _rows(
      group_baselines.reinforce_pp_baseline(s, g, VALID, num_groups=P, lengths=lengths, **kw)[0]
    ),
    RPP,
  ),
  "adv/reinforce_pp_token": Case(
    lambda **kw: (
      np.asarray(group_baselines.reinforce_pp_token(X["token_rewards"], MASK, gamma=0.9, **kw)[0]),
      None,
    ),
    WHITENING,
  ),
  "adv/remax": Case(lambda: _rows(group_baselines.remax(s, X["baseline"], VALID)[0])),
  "adv/gae": Case(
    lambda **kw: (
      np.asarray(
        value.gae_tokens(X["token_rewards"], X["values"], MASK, gamma=0.9, lam=0.95, **kw)[0]
      ),
      None,
    ),
    WHITENING,
    on_mask=True,
  ),
  **{
    f"loss/ppo_clip/{mode}": Case(
      _loss(ppo_family.ppo_clip, aggregation=agg, norm_length=T),
      {"dual_clip": 3.0}
      if mode != "seq-mean-token-sum-norm"
      else {"dual_clip": 3.0, "aggregation": "token_sum_norm"},
    )
    for mode, agg in AGG.items()
  },
  **{
    f"loss/ppo_clip/extreme/{name}": Case(_loss(ppo_family.ppo_clip, _arrays(x), dual_clip=3.0))
    for name, x in FIXTURE["extreme_inputs"].items()
  },
  "loss/gspo": Case(_loss(sequence_level.gspo, aggregation="seq_mean_token_mean")),
  "loss/sapo": Case(_loss(ppo_family.sapo, aggregation="seq_mean_token_mean")),
  "loss/cispo": Case(_loss(ppo_family.cispo, eps_low=0.2, eps_high=0.28)),
  "loss/gpg": Case(_loss(ppo_family.reinforce)),
  "loss/gmpo": Case(_loss(sequence_level.gmpo, aggregation="seq_mean_token_mean")),
  "loss/clip_cov": Case(_loss(covariance.clip_cov, clip_cov_ratio=1.0, clip_cov_lb=0.05)),
  "loss/kl_cov": Case(_loss(covariance.kl_cov, kl_cov_ratio=0.1, ppo_kl_coef=1.0)),
  "loss/value": Case(_value_loss),
  "kl/k1": Case(_kl("k1")),
  "kl/k2": Case(_kl("k2")),
  "kl/k3": Case(_kl("k3"), {"clamp": 10.0}),
  "kl/abs": Case(_kl("abs")),
  "entropy": Case(_entropy),
}


HOLED = dict(X, mask=np.asarray(FIXTURE["holed_mask"], np.float32))
HOLED["token_rewards"] = X["token_rewards"] * HOLED["mask"]
CASES["adv/gae/holed"] = Case(
  lambda **kw: (
    np.asarray(
      value.gae_tokens(
        HOLED["token_rewards"], X["values"], HOLED["mask"], gamma=0.9, lam=0.95, **kw
      )[0]
    ),
    None,
  ),
  WHITENING,
  on_mask=True,
)
CASES["loss/ppo_clip/holed"] = Case(
  _loss(ppo_family.ppo_clip, HOLED, aggregation="seq_mean_token_mean"), {"dual_clip": 3.0}
)


def _gspo_far():
  """Every sequence beyond GSPO's bound log s = 10, negative advantages (the recorded case)."""
  x = dict(X)
  x["logprobs"] = X["old_logprobs"] + np.float32(12.0)
  x["advantages"] = -np.abs(X["advantages"])
  return x


CASES["loss/gspo/clamped"] = Case(
  _loss(sequence_level.gspo, _gspo_far(), aggregation="seq_mean_token_mean")
)


def _recorded(name):
  entry = FIXTURE["cases"][name]
  grad = entry.get("grad")
  value = np.asarray(entry["value"])
  if name in CASES and CASES[name].on_mask:
    value = value * (HOLED["mask"] if name.endswith("/holed") else MASK)
  return value, None if grad is None else np.asarray(grad)


def _close(got, want) -> bool:
  (v, gr), (wv, wg) = got, want
  ok = np.allclose(v, wv, rtol=RTOL, atol=ATOL)
  if wg is not None:
    ok = ok and gr is not None and np.allclose(gr, wg, rtol=RTOL, atol=ATOL)
  return bool(ok)


def test_every_recorded_case_is_mapped():
  # the straight-through KL and the holed REINFORCE++ returns: their own tests below
  recorded = set(FIXTURE["cases"]) - {"kl/k1+", "kl/k3+", "adv/reinforce_pp_token/holed"}
  assert recorded == set(CASES), recorded ^ set(CASES)
  assert FIXTURE["commit"].startswith("b178a3c")


@pytest.mark.parametrize("name", sorted(CASES))
def test_library_equals_verl_or_differs_by_a_documented_convention(name):
  case, want = CASES[name], _recorded(name)
  if case.convention is None:
    got = case.run()
    np.testing.assert_allclose(got[0], want[0], rtol=RTOL, atol=ATOL, err_msg=f"{name}: value")
    if want[1] is not None:
      np.testing.assert_allclose(got[1], want[1], rtol=RTOL, atol=ATOL, err_msg=f"{name}: grad")
    return
  switched = case.run(**case.convention)
  assert _close(switched, want), f"{name}: with {case.convention} the library should equal verl"
  assert not _close(case.run(), want), (
    f"{name}: the defaults equal verl, so {case.convention} is no longer a convention; "
    "map the case as equal"
  )
  for key in case.convention:
    assert f"`{key}`" in REFERENCE_MD.split("## Conventions", 1)[-1], (
      f"docs/reference.md's Conventions section does not name `{key}` ({name})"
    )


@pytest.mark.parametrize("est,base", [("k1+", "k1"), ("k3+", "k3")])
def test_straight_through_estimators_are_verls_value_with_k2s_gradient(est, base):
  """At the pin verl's kl_penalty raises NotImplementedError for the '+' names (its forward
  function does not strip the '+'); its own definition is the value of k1 / k3 with the
  gradient of k2, which the recorded k1, k3 and k2 cases give."""
  assert FIXTURE["cases"][f"kl/{est}"] == {"error": "NotImplementedError"}
  got_value, got_grad = _kl(est, **({"clamp": 10.0} if base == "k3" else {}))()
  np.testing.assert_allclose(got_value, _recorded(f"kl/{base}")[0], rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(got_grad, _recorded("kl/k2")[1], rtol=RTOL, atol=ATOL)


def test_the_edge_cases_where_the_library_differs_on_purpose():
  """Where verl's answer is not a convention but an edge case (docs/reference.md): a one-row
  group keeps its raw reward in verl's group estimators (baseline 0) and gets 0 here; an
  all-equal group of 7.3 gets verl's float32 rounding error times 1e4 from its whitening and 0
  here."""
  one = np.array([2.0, 1.0, 0.0, 5.0], np.float32)
  group = np.array([0, 0, 0, 1], np.int32)
  for name in ("grpo", "rloo", "dr_grpo"):
    adv, _ = getattr(group_baselines, name)(one, group, np.ones(4, np.float32), num_groups=2)
    assert float(adv[3]) == 0.0, name
  adv, _ = group_baselines.opo(one, group, np.ones(4, np.float32), np.ones(4), num_groups=2)
  assert float(adv[3]) == 0.0
  flat = jnp.full((3,), 7.3)
  for w in reductions.WHITENINGS:
    assert np.all(np.asarray(reductions.masked_whiten(flat, jnp.ones(3), whitening=w)) == 0.0)
  assert hysteretic.POLICY_LOSSES and kl.KL_ESTIMATORS  # the modules the docs point to


def test_reinforce_pp_returns_run_across_holes_where_verl_resets_them():
  """verl resets REINFORCE++'s running return at every masked position; here the return runs
  across a hole. Rows without holes agree (up to the whitening, which mixes every row), and
  the holed rows' tokens before a hole differ."""
  mask = HOLED["mask"]
  want = np.asarray(FIXTURE["cases"]["adv/reinforce_pp_token/holed"]["value"]) * mask
  got = np.asarray(
    group_baselines.reinforce_pp_token(
      HOLED["token_rewards"], mask, gamma=0.9, whitening="unbiased"
    )[0]
  )
  holed_rows = [0, 2, 5, 8]
  before = np.zeros(mask.shape, bool)
  before[0, :2] = before[2, :1] = before[5, :3] = before[8, :1] = True
  assert not np.allclose(got[before], want[before], atol=1e-3)
  # verl's own returns with the reset, whitened by the library: equal to verl's everywhere
  returns = np.zeros(mask.shape, np.float64)
  for b in range(mask.shape[0]):
    run = 0.0
    for t in reversed(range(mask.shape[1])):
      run = HOLED["token_rewards"][b, t] + 0.9 * run
      returns[b, t] = run
      run *= mask[b, t]
  whitened = reductions.masked_whiten(
    jnp.asarray(returns, jnp.float32), jnp.asarray(mask), whitening="unbiased"
  )
  np.testing.assert_allclose(np.asarray(whitened), want, rtol=RTOL, atol=ATOL)
  assert set(holed_rows) == set(np.flatnonzero((np.diff(mask, axis=1) > 0).any(axis=1)))


# ----------------------------------------------------------------------------------------------
# TRL: GRPOTrainer's losses, the KL term included (β > 0), through the library's own loss path.

TX = {k: np.asarray(v, np.float32) for k, v in TRL["inputs"].items()}
TRL_T = TX["mask"].shape[1]


def _trl_total(fn, *, beta=0.0, aggregation="token_mean", **fixed):
  """The policy loss plus, with β > 0, the RL step's KL term (train/loss_terms.kl, k3)."""
  from posttrain_jax.train import loss_terms, updates

  def run(**conv):
    cfg = updates.RLLossConfig(
      kl_coef=beta, kl_estimator="k3", aggregation=aggregation, norm_length=TRL_T, **conv
    )
    mask = jnp.asarray(TX["mask"])

    def total(lp):
      loss, _ = fn(
        lp,
        TX["old_logprobs"],
        TX["advantages"],
        mask,
        aggregation=aggregation,
        norm_length=TRL_T,
        **fixed,
      )
      if beta:
        batch = types.SimpleNamespace(
          ref_logprobs=jnp.asarray(TX["ref_logprobs"]), old_logprobs=jnp.asarray(TX["old_logprobs"])
        )
        x = loss_terms.TermInputs(lp, None, None, batch, mask, None, 0)
        loss, _ = loss_terms.kl(loss, x, {"kl_coef": beta}, cfg)
      return loss

    v, g = jax.value_and_grad(total)(jnp.asarray(TX["logprobs"]))
    return np.asarray(v), np.asarray(g)

  return run


CORRECTED = {"kl_bias_correction": True}  # TRL's default use_bias_correction_kl
POLICY_KL = {"kl_aggregation": "policy", **CORRECTED}
TRL_CASES: dict[str, Case] = {
  "grpo": Case(_trl_total(ppo_family.ppo_clip, aggregation="seq_mean_token_mean")),
  "grpo/kl": Case(
    _trl_total(ppo_family.ppo_clip, beta=0.04, aggregation="seq_mean_token_mean"), POLICY_KL
  ),
  "grpo/delta": Case(
    _trl_total(
      ppo_family.ppo_clip, aggregation="seq_mean_token_mean", clip_high=0.28, dual_clip=1.5
    )
  ),
  "grpo/sequence": Case(_trl_total(sequence_level.gspo, aggregation="seq_mean_token_mean")),
  "bnpo/kl": Case(_trl_total(ppo_family.ppo_clip, beta=0.04), CORRECTED),
  "bnpo/kl_uncorrected": Case(_trl_total(ppo_family.ppo_clip, beta=0.04)),
  "dr_grpo": Case(_trl_total(ppo_family.ppo_clip, aggregation="seq_mean_token_sum_norm")),
  "dr_grpo/kl": Case(
    _trl_total(ppo_family.ppo_clip, beta=0.04, aggregation="seq_mean_token_sum_norm"), POLICY_KL
  ),
  "dapo": Case(_trl_total(ppo_family.ppo_clip, clip_high=0.28)),
  "cispo": Case(_trl_total(ppo_family.cispo, eps_low=None, eps_high=4.0)),
  "sapo": Case(_trl_total(ppo_family.sapo, aggregation="seq_mean_token_mean")),
  "luspo": Case(_trl_total(sequence_level.luspo, aggregation="seq_mean_token_sum")),
  "vespo": Case(_trl_total(sequence_level.vespo)),
}


def test_every_trl_case_is_mapped():
  assert set(TRL["cases"]) == set(TRL_CASES)
  assert TRL["version"] == "1.16.0"


@pytest.mark.parametrize("name", sorted(TRL_CASES))
def test_library_equals_trl_or_differs_by_a_documented_convention(name):
  case, entry = TRL_CASES[name], TRL["cases"][name]
  want = (np.asarray(entry["value"]), np.asarray(entry["grad"]))
  if case.convention is None:
    got = case.run()
    np.testing.assert_allclose(got[0], want[0], rtol=RTOL, atol=ATOL, err_msg=f"{name}: value")
    np.testing.assert_allclose(got[1], want[1], rtol=RTOL, atol=ATOL, err_msg=f"{name}: grad")
    return
  assert _close(case.run(**case.convention), want), f"{name}: with {case.convention}"
  assert not _close(case.run(), want), f"{name}: the defaults equal TRL's; map it as equal"
  for key in case.convention:
    assert f"`{key}`" in REFERENCE_MD.split("## Conventions", 1)[-1], key
