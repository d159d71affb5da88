"""The welfare axis in the eval stage (train/welfare_eval.py): concept vectors are differences of
means of the captured views, the valence direction of WIN and FAIL episodes, a policy compared
with itself gains no alignment, steering by zero changes nothing and steering by v moves the
WIN-over-FAIL gap, and the config check names the env."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posttrain_jax import methods as methods_lib
from posttrain_jax.analysis import representations as rep
from posttrain_jax.methods import validate
from posttrain_jax.sweeps import runner
from posttrain_jax.train import welfare_eval
from posttrain_jax.train.validate import ConfigError

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _config():
  module = runner.load_config_module(os.path.join(REPO, "experiments", "welfare.py"))
  c = module.get_config("arm=maze,seed=0,smoke=True")
  c.progress = False
  return c


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
  return methods_lib.make_context(
    _config(), str(tmp_path_factory.mktemp("welfare")), check_memory=False
  )


def test_vectors_are_differences_of_means_of_the_views(ctx):
  params = ctx.init_params
  capture = rep.make_capture(ctx.graphdef)
  level = ctx.config.env.level
  got = welfare_eval.concept_vectors(ctx, params, capture, 1, level)
  model = nnx.merge(ctx.graphdef, params)
  views = welfare_eval.views(level)

  def mean_state(prompts):
    out = []
    for p in prompts:
      ids = ctx.tokenizer([p], add_special_tokens=False)["input_ids"][0]
      out.append(
        np.asarray(model(jnp.asarray([ids]), return_hidden_states=True).hidden_states[1, 0, -1])
      )
    return np.mean(out, axis=0)

  path = mean_state(views["path"])
  for kind in ("gold", "mold"):
    np.testing.assert_allclose(got[kind], mean_state(views[kind]) - path, atol=1e-4)


def test_self_comparison_and_steering(ctx):
  params = ctx.init_params
  out = welfare_eval.evaluate(ctx, params, params, layer=1, n=6, alpha=4.0)
  assert out["welfare_cos_v"] == pytest.approx(out["welfare_cos_u"])
  assert out["welfare_align_gain_gold"] == pytest.approx(0.0, abs=1e-6)
  wins, fails = welfare_eval.episodes(ctx, 6)
  prompts = wins + fails
  L = nnx.merge(ctx.graphdef, params).config.num_layers
  zero = rep.steering(L, 1, jnp.ones(nnx.merge(ctx.graphdef, params).config.hidden_size), 0.0)
  base = welfare_eval.logit_gap(ctx, params, prompts)
  assert welfare_eval.logit_gap(ctx, params, prompts, zero) == pytest.approx(base, abs=1e-6)
  assert out["welfare_steer_gold"] != 0.0 and out["welfare_steer_mold"] != 0.0
  assert all(w != f for w, f in zip(wins, fails))
  with pytest.raises(ValueError, match="welfare_layer=9"):
    welfare_eval.evaluate(ctx, params, params, layer=9, n=2, alpha=1.0)


def test_config_names_the_env():
  c = _config()
  validate(c)
  c.env.name, c.env.level = "arithmetic", 3
  with pytest.raises(ConfigError, match="config.eval.welfare reads the welfare env"):
    validate(c)


def test_the_axis_is_followed_over_rl(tmp_path):
  """methods/welfare/ logs the axis at every RL evaluation: at step 0 (the start) it equals the
  eval stage's control measures (u), after the last step its RL measures (v). (The smoke base
  scores 0, so RL leaves it where it was; the next test shows the tracker follows the params.)"""
  c = _config()
  c.rl.update(steps=2, eval_every=2)
  c.eval.welfare_examples = 4
  methods_lib.run(c, str(tmp_path))
  rows = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
  evals = {r["step"]: r for r in rows if "welfare/align_gold" in r}
  assert sorted(evals) == [0, 2]
  summary = json.loads((tmp_path / "summary.json").read_text())
  for step, tag in ((0, "u"), (2, "v")):
    assert evals[step]["welfare/cos"] == pytest.approx(summary[f"welfare_cos_{tag}"], abs=1e-5)
    for kind in ("gold", "mold"):
      got = evals[step][f"welfare/align_{kind}"]
      assert got == pytest.approx(summary[f"welfare_align_{tag}_{kind}"], abs=1e-5)


def test_the_tracker_measures_the_params_it_is_given(ctx):
  """Against the start's valence direction, the tracker gives the eval stage's v measures of
  any policy (here the start perturbed), not the start's (u), which differ."""
  import jax

  start = ctx.init_params
  leaves, treedef = jax.tree.flatten(start)
  keys = jax.random.split(jax.random.key(3), len(leaves))
  moved = jax.tree.unflatten(
    treedef, [x + 0.05 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
  )
  want = welfare_eval.evaluate(ctx, start, moved, layer=1, n=4, alpha=1.0)
  got = welfare_eval.tracker(ctx, start, layer=1, n=4)(moved, None)
  assert got["welfare/cos"] == pytest.approx(want["welfare_cos_v"], abs=1e-6)
  for kind in ("gold", "mold"):
    assert got[f"welfare/align_{kind}"] == pytest.approx(want[f"welfare_align_v_{kind}"], abs=1e-6)
  assert abs(want["welfare_align_v_gold"] - want["welfare_align_u_gold"]) > 1e-3
