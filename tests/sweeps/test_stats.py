import math
import os

import numpy as np
import pytest

from posttrain_jax.sweeps import report, stats


@pytest.mark.parametrize(
  "t,df,p",
  [(2.0, 5, 0.10191), (3.182, 3, 0.05), (12.706, 1, 0.05), (0.0, 4, 1.0), (2.262, 9, 0.05)],
)
def test_t_two_sided_p_matches_tables(t, df, p):
  assert stats.t_sf_two_sided(t, df) == pytest.approx(p, abs=2e-4)


def test_mean_ci_and_paired_test():
  x = [1.0, 2.0, 3.0]
  mean, half = stats.mean_ci(x)
  assert mean == 2.0 and half == pytest.approx(4.303 * 1.0 / math.sqrt(3), rel=1e-6)
  assert math.isnan(stats.mean_ci([1.0])[1])
  diff, half, p = stats.paired_t_test([2.0, 3.0, 4.5, 5.0], [1.0, 2.5, 3.0, 4.6])
  d = np.array([1.0, 0.5, 1.5, 0.4])
  t = d.mean() / (d.std(ddof=1) / 2)
  assert diff == pytest.approx(d.mean())
  assert p == pytest.approx(stats.t_sf_two_sided(t, 3))
  assert stats.paired_t_test([1, 2], [1, 2])[2] == 1.0


def test_sign_flip_exact():
  # All 8 sign patterns of (1, 1, 1): only the two all-same ones reach |mean| = 1.
  assert stats.paired_sign_flip_p([1, 1, 1], [0, 0, 0]) == pytest.approx(2 / 8)


def test_report_tolerates_a_metric_some_runs_did_not_record(tmp_path):
  import ml_collections

  from posttrain_jax.sweeps import report

  sweep = ml_collections.ConfigDict(
    dict(
      title="t",
      arms=("base", "new"),
      baseline="base",
      metrics=("acc", "retention"),
      claim=ml_collections.ConfigDict(
        dict(text="new is better", arm="new", metric="retention", direction="higher")
      ),
      curves=(),
    )
  )
  records = [
    {"arm": "base", "seed": 0, "acc": 0.5, "retention": 0.2},
    {"arm": "new", "seed": 0, "acc": 0.6, "retention": 0.4},
    {"arm": "base", "seed": 1, "acc": 0.4},  # empty correct set
    {"arm": "new", "seed": 1, "acc": 0.5, "retention": 0.3},
    {"arm": "base", "seed": 2, "acc": 0.3, "retention": 0.1},
    {"arm": "new", "seed": 2, "acc": 0.35, "retention": 0.3},
  ]
  text = report.write_report(str(tmp_path), sweep, records, "cmd")
  assert "2 of 2 seeds higher" in text  # the seed without the metric is left out of the pair
  assert "(2 of 3 seeds)" in text
  base_row = next(l for l in text.splitlines() if l.startswith("| base"))
  assert "0.150" in base_row  # mean retention over the 2 seeds that have it


def test_check_shared_allows_rl_only_env_fields_and_rejects_the_rest():
  import importlib
  import types

  import ml_collections
  import pytest

  from posttrain_jax import defaults

  reproduce = importlib.import_module("posttrain_jax.sweeps.reproduce")

  def get_config(arg):
    args = defaults.parse_arg(arg, smoke=False, seed=0, arm="a")
    c = defaults.base_config()
    if args.arm == "b":
      c.env.dataset = "/some/train.jsonl"  # RL's prompt source only: allowed
    if args.arm == "c":
      c.env.level = 4  # changes pretraining: rejected
    c.sweep = ml_collections.ConfigDict(
      dict(arms=("a", "b", "c"), baseline="a", shared_stages=("pretrain",))
    )
    return c

  module = types.SimpleNamespace(get_config=get_config)
  sweep = get_config(None).sweep
  sweep.arms = ("a", "b")
  reproduce.check_shared(module, sweep, False)
  sweep.arms = ("a", "b", "c")
  with pytest.raises(ValueError, match="arm 'c' changes config.env"):
    reproduce.check_shared(module, sweep, False)
  sweep.shared_stages = ()  # nothing shared: arms may differ in their env, not in the model
  reproduce.check_shared(module, sweep, False)
  plain = get_config

  def other_model(arg):
    c = plain(arg)
    if "arm=c" in (arg or ""):
      c.model.preset = "small"
    return c

  with pytest.raises(ValueError, match="arm 'c' changes config.model"):
    reproduce.check_shared(types.SimpleNamespace(get_config=other_model), sweep, False)


def test_repair_curve_script_pools_seeds_per_arm(tmp_path):
  import json
  import subprocess
  import sys

  repo = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
  # one prompt per seed: correct at step 0, wrong at 3 (regressed after a delay of 3), correct
  # again at 5 (restored: 2 visits, 2 steps, 16 rollouts)
  for seed in (0, 1):
    path = tmp_path / "runs" / f"seed{seed}" / "review" / "rl"
    path.mkdir(parents=True)
    events = [
      {"step": s, "uid": "p", "correct": c, "rollouts": 8}
      for s, c in ((0, True), (3, False), (5, True))
    ]
    (path / "review_events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
  proc = subprocess.run(
    [sys.executable, os.path.join(repo, "scripts", "repair_curve.py"), str(tmp_path)],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 0, proc.stderr
  text = (tmp_path / "repair_curve.md").read_text()
  # both seeds' episodes pooled (uids kept apart): 2 episodes at delay [2, 4), both restored
  assert "| review | [2, 4) | 2 | 1.0000 | 2 | 2.0000 | 2.0000 | 16.0000 |" in text
  missing = subprocess.run(
    [sys.executable, os.path.join(repo, "scripts", "repair_curve.py"), str(tmp_path / "nothing")],
    capture_output=True,
    text=True,
  )
  assert missing.returncode == 2 and "review_events.jsonl" in missing.stderr


@pytest.mark.parametrize(
  "q, df, expected", [(0.975, 4, 2.776), (0.8, 4, 0.941), (0.975, 10, 2.228), (0.8, 29, 0.854)]
)
def test_t_quantile_matches_tables(q, df, expected):
  assert stats.t_quantile(q, df) == pytest.approx(expected, abs=1e-3)


def test_detectable_effect_is_the_power_formula_and_simulates_to_80_percent():
  """(t_.975 + t_.8) sd / sqrt(n); a true effect of that size is detected ~80% of the time."""
  rng = np.random.default_rng(0)
  d = rng.normal(size=5)
  mde = stats.detectable_effect(d, np.zeros(5))
  assert mde == pytest.approx((2.7764 + 0.9410) * d.std(ddof=1) / np.sqrt(5), rel=1e-3)
  n, sd = 8, 1.0
  effect = stats.detectable_effect(
    rng.normal(0, sd, 2000)[:n] * 0 + np.linspace(-1, 1, n) / np.std(np.linspace(-1, 1, n), ddof=1),
    np.zeros(n),
  )
  hits = [stats.paired_t_test(rng.normal(effect, sd, n), np.zeros(n))[2] < 0.05 for _ in range(400)]
  assert 0.72 < np.mean(hits) < 0.88
  assert np.isnan(stats.detectable_effect([1.0], [0.0]))


def test_mechanism_sentence_is_unwrapped_from_the_config_docstring():
  doc = (
    "Title.\n\nTask: x. Why this setting\nexposes the mechanism: the student\n  errs on "
    "carries.\n\nClaim: y."
  )
  assert report.mechanism(doc) == (
    "Why this setting exposes the mechanism: the student errs on carries."
  )
  assert report.mechanism("no such sentence") == "" and report.mechanism(None) == ""
  needs = (
    doc + "\n\nWhat the mechanism needs, and how this setting provides it: headroom;\nthe base."
  )
  assert report.mechanism(needs) == (
    "Why this setting exposes the mechanism: the student errs on carries. What the mechanism "
    "needs, and how this setting provides it: headroom; the base."
  )


def test_mechanism_check_counts_seeds_and_qualifies_a_verdict_resting_on_too_few(tmp_path):
  from posttrain_jax.sweeps import report
  from posttrain_jax.train import configs

  claim = dict(text="new is better", arm="new", metric="acc", direction="higher")
  records = []
  for seed, (base, new, used, pred, stale) in enumerate(
    [(0.3, 0.5, 1, 0.9, 0.8), (0.2, 0.4, 0, 0.7, 0.8), (0.4, 0.5, 0, 0.6, 0.8)]
  ):
    records.append({"arm": "base", "seed": seed, "acc": base})
    records.append(
      {"arm": "new", "seed": seed, "acc": new, "accepted": used, "pred": pred, "stale": stale}
    )

  def table(**engaged):
    sweep = configs.sweep(
      title="t",
      arms=("base", "new"),
      baseline="base",
      claim=claim,
      metrics=("acc",),
      shared_stages=(),
      engaged=dict(text="it acted", arm="new", metric="accepted", **engaged),
    )
    return report.write_report(str(tmp_path), sweep, records, "cmd", curves=False)

  text = table(above=0)
  assert (
    "Mechanism check (declared before the runs): it acted: new's accepted > 0 in 1 of 3" in text
  )
  lines = text.splitlines()
  verdict = lines[lines.index(next(x for x in lines if x.startswith("Claim:"))) + 1]
  assert verdict.endswith(
    "The mechanism engaged in 1 of 3 seeds, so this verdict says little about the method itself."
  )
  # Against another key of the same run: seed 0 only (0.9 > 0.8).
  sweep = configs.sweep(
    title="t",
    arms=("base", "new"),
    baseline="base",
    claim=claim,
    metrics=("acc",),
    shared_stages=(),
    engaged=dict(text="x", arm="new", metric="pred", versus_metric="stale"),
  )
  from posttrain_jax.sweeps import verdicts

  assert verdicts.engagement(sweep.engaged, verdicts.by_arm_of(records)) == (1, 3)
  records[3]["accepted"] = 2  # two of three seeds: no qualification
  text = table(above=0, after_runs=True)
  assert "declared after the runs" in text and "2 of 3 seeds." in text
  assert "says little" not in text
  with pytest.raises(ValueError, match="sweep engaged must be"):
    table(above=0, versus_metric="stale")
