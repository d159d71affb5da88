"""SVEB (analysis/value_benchmark.py, train/value_benchmark.py): the scores against hand
computations, the Monte-Carlo ground truth on a greedy policy (a greedy continuation of a
greedy response's prefix is the response again, so ``V*`` is its reward exactly), and the eval
stage's summary keys."""

import json
import os

import jax
import numpy as np
import pytest

from posttrain_jax import methods as methods_lib
from posttrain_jax.analysis import value_benchmark
from posttrain_jax.sweeps import runner
from posttrain_jax.train import experiment
from posttrain_jax.train import value_benchmark as sveb

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_scores_against_hand_computations():
  truth = np.asarray([0.0, 0.5, 1.0, 0.25, 0.75, 1.0])
  prompts = np.asarray([0, 0, 0, 1, 1, 1])
  values = np.asarray([0.1, 0.4, 0.8, 0.3, 0.9, 0.7])
  s = value_benchmark.score(values, truth, prompts)
  assert s["mse"] == pytest.approx(np.mean((values - truth) ** 2))

  def ranks(x):  # average ranks (ties share theirs)
    return np.asarray([np.mean(np.flatnonzero(np.sort(x) == v)) for v in x])

  assert s["spearman"] == pytest.approx(np.corrcoef(ranks(values), ranks(truth))[0, 1])
  # the prompt's share of the variance: 1 when values depend on the prompt only, 0 when every
  # prompt has the same mean
  assert value_benchmark.collapse([0.2, 0.2, 0.2, 0.7, 0.7, 0.7], prompts) == pytest.approx(1.0)
  assert value_benchmark.collapse([0.1, 0.5, 0.3, 0.3, 0.2, 0.4], prompts) == pytest.approx(0.0)
  m = np.asarray([0.5, 0.1, 0.3, 0.9, 0.6, 0.3])
  mean = m.mean()
  between = 3 * (m[:3].mean() - mean) ** 2 + 3 * (m[3:].mean() - mean) ** 2
  assert value_benchmark.collapse(m, prompts) == pytest.approx(between / ((m - mean) ** 2).sum())
  assert np.isnan(value_benchmark.score(np.ones(6), truth, prompts)["spearman"])
  with pytest.raises(ValueError, match="must be equal"):
    value_benchmark.score(values[:3], truth, prompts)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  c = runner.load_config_module(os.path.join(REPO, "experiments", "quickstart.py")).get_config(
    "smoke"
  )
  c.progress = False
  c.stages = ("pretrain", "rl", "eval")
  c.rl.update(advantage="gae", steps=2, critic_lr=1e-2)  # a PPO critic, trained 2 steps
  c.eval.update(sveb=True, sveb_prompts=4, sveb_group=4, sveb_cuts=1, sveb_continuations=2)
  workdir = str(tmp_path_factory.mktemp("sveb") / "run")
  methods_lib.run(c, workdir)
  return workdir, c


def test_greedy_ground_truth_is_the_responses_own_reward(run):
  workdir, c = run
  c = c.copy_and_resolve_references()
  c.rl.temperature = 0.0
  ctx = methods_lib.make_context(c, workdir, check_memory=False)
  params = experiment.load_final(workdir, "pretrain")[0]
  mc = sveb.mc_states(ctx, params, prompts=4, group=2, cuts=2, continuations=3)
  assert len(mc["states"]) > 0
  b = mc["states"][:, 0]
  np.testing.assert_array_equal(mc["truth"], mc["rewards"][b])
  assert (mc["states"][:, 1] >= 1).all() and (mc["states"][:, 1] < mc["lengths"][b]).all()


def test_eval_stage_reports_sveb_per_estimator(run):
  workdir, _ = run
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  assert summary["sveb_states_before_rl"] > 0
  assert 0.0 <= summary["sveb_truth_mean_before_rl"] <= 1.0
  for name in sveb.ESTIMATORS:
    assert summary[f"sveb_mse_{name}_before_rl"] >= 0.0
    assert f"sveb_spearman_{name}_before_rl" in summary


def _sveb_args():
  return dict(prompts=4, group=4, cuts=1, continuations=2)


def test_extra_estimators_are_scored_on_the_same_states(run):
  """Constant values 0 and 1 score E[V*^2] and E[(1 - V*)^2], whose difference is
  1 - 2 E[V*] (the states' truth mean), and an estimator equal to the group mean ties it."""
  workdir, c = run
  ctx = methods_lib.make_context(c, workdir, check_memory=False)
  params = experiment.load_final(workdir, "pretrain")[0]
  T = c.rl.max_new_tokens
  zero = lambda tokens, start: np.zeros((tokens.shape[0], T))  # noqa: E731
  one = lambda tokens, start: np.ones((tokens.shape[0], T))  # noqa: E731
  out = sveb.benchmark(ctx, params, **_sveb_args(), extra={"zero": zero, "one": one})
  assert out["sveb_mse_one"] - out["sveb_mse_zero"] == pytest.approx(
    1 - 2 * out["sveb_truth_mean"], abs=1e-6
  )
  assert out["sveb_mse_below_group_mean_zero"] == pytest.approx(
    out["sveb_mse_group_mean"] - out["sveb_mse_zero"]
  )
  with pytest.raises(ValueError, match="may not be named 'numca'"):
    sveb.benchmark(ctx, params, **_sveb_args(), extra={"numca": zero})


def test_the_trained_ppo_critic_is_scored_after_rl(run):
  """The gae run keeps its critic (rl/critic_final) and the eval stage scores it beside the
  library's estimators after RL, not before (a new head has nothing to score)."""
  from posttrain_jax.methods import critic

  workdir, c = run
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  assert "sveb_mse_critic_before_rl" not in summary
  ctx = methods_lib.make_context(c, workdir, check_memory=False)
  graphdef, fresh = critic.build_critic(ctx.graphdef, ctx.init_params, c.seed)
  trained = ctx.load_params("rl", critic.FINAL, fresh)
  assert trained is not None
  moved = [
    float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
    for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(fresh))
  ]
  assert max(moved) > 0  # the critic's parameters are the trained ones, not the start's
  # The summary's critic scores are those of these parameters on the after-RL policy's states.
  value_fn = critic.make_value_fn(graphdef, ctx.prompt_len)
  after = experiment.load_final(workdir, "rl")[0]
  out = sveb.benchmark(
    ctx, after, **_sveb_args(), extra={"ppo": lambda t, s: value_fn(trained, t, s)}
  )
  for score in ("mse", "spearman", "collapse"):
    want, got = out[f"sveb_{score}_ppo"], summary[f"sveb_{score}_critic_after_rl"]
    assert got == pytest.approx(want, abs=1e-6, nan_ok=True), score
  assert summary["sveb_mse_critic_after_rl"] != summary["sveb_mse_group_mean_after_rl"]
