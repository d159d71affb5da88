"""The rerun check's comparison and verdict swap (sweeps/rerun_check.py) and the environment
record (sweeps/environment.py), on fabricated runs; the whole command runs on a smoke config
in test_reproduce_smoke.py."""

import json
import math
import os
import subprocess

import ml_collections
import numpy as np
import pytest

from posttrain_jax import defaults
from posttrain_jax.sweeps import environment, index, report, rerun_check

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _sweep():
  return ml_collections.ConfigDict(
    dict(
      title="t",
      arms=("base", "method"),
      baseline="base",
      metrics=("accuracy_after_rl",),
      claim=dict(
        text="method beats base",
        arm="method",
        metric="accuracy_after_rl",
        direction="higher",
        start=False,
      ),
    )
  )


def _runs(method_gain: float, seeds=range(5), noise=0.01):
  rng = np.random.default_rng(0)
  out = []
  for s in seeds:
    base = 0.5 + 0.05 * s
    out.append({"arm": "base", "seed": s, "accuracy_after_rl": base})
    out.append(
      {"arm": "method", "seed": s, "accuracy_after_rl": base + method_gain + noise * rng.normal()}
    )
  return out


def test_an_identical_rerun_is_identical_and_keeps_the_verdict():
  sweep, recorded = _sweep(), _runs(0.1)
  rerun = [dict(r) for r in recorded if r["seed"] == 0]
  result = rerun_check.summarise(sweep, recorded, rerun, [0], {})
  assert result["identical"] and result["verdict"] == {
    **result["verdict"],
    "before": "reproduced",
    "after": "reproduced",
    "changed": False,
  }
  assert len(result["rows"]) == 2 and all(r["diff"] == 0 for r in result["rows"])


def test_the_spread_and_a_verdict_that_flips_are_reported():
  sweep, recorded = _sweep(), _runs(0.1)
  # The rerun of every seed: the method now loses by 0.1 on each.
  rerun = [
    {**r, "accuracy_after_rl": r["accuracy_after_rl"] - (0.2 if r["arm"] == "method" else 0.0)}
    for r in recorded
  ]
  result = rerun_check.summarise(sweep, recorded, rerun, list(range(5)), {})
  assert not result["identical"]
  top = result["spread"]["accuracy_after_rl"]
  assert top["max_abs_diff"] == pytest.approx(0.2) and top["arm"] == "method"
  v = result["verdict"]
  assert (v["before"], v["after"], v["changed"]) == ("reproduced", "contradicted", True)
  assert [(p["before"], p["after"]) for p in v["parts"] if not p["control"]] == [
    ("supported", "opposed")
  ]
  sd = np.std([r["accuracy_after_rl"] for r in recorded if r["arm"] == "method"], ddof=1)
  assert top["seed_sd"] == pytest.approx(sd) and top["relative"] == pytest.approx(0.2 / sd)
  line = rerun_check.table_line({**result, "environment": {"cpu": {"model": "CPU X"}}})
  assert (
    "on CPU X" in line
    and "largest change on the claim's metrics 0.2 in accuracy_after_rl "
    f"(method; {0.2 / sd:.2g} x its between-seed SD)"
    in line
  )
  assert "would be contradicted, not reproduced: it is not robust" in line


def test_a_small_spread_on_one_seed_leaves_the_verdict():
  sweep, recorded = _sweep(), _runs(0.1)
  rerun = [
    {**r, "accuracy_after_rl": r["accuracy_after_rl"] + 0.004} for r in recorded if r["seed"] == 2
  ]
  result = rerun_check.summarise(sweep, recorded, rerun, [2], {})
  assert not result["identical"] and not result["verdict"]["changed"]
  assert result["spread"]["accuracy_after_rl"]["max_abs_diff"] == pytest.approx(0.004)
  # only the rerun seed's rows, and the swap replaced exactly those runs
  assert {r["seed"] for r in result["rows"]} == {2}
  swapped = rerun_check.swapped(recorded, rerun)
  assert len(swapped) == len(recorded)
  assert sorted(r["accuracy_after_rl"] for r in swapped if r["seed"] == 2) == sorted(
    r["accuracy_after_rl"] for r in rerun
  )


def test_a_metric_one_side_lacks_is_shown_not_dropped():
  sweep, recorded = _sweep(), _runs(0.1, seeds=[0])
  rerun = [{k: v for k, v in r.items() if k != "accuracy_after_rl"} for r in recorded]
  result = rerun_check.summarise(sweep, recorded, rerun, [0], {})
  assert not result["identical"] and all(math.isnan(r["rerun"]) for r in result["rows"])


def test_the_table_states_its_last_check(tmp_path):
  sweep, recorded = _sweep(), _runs(0.1)
  report.write_report(str(tmp_path), sweep, recorded, "cmd", curves=False)
  text = (tmp_path / "table.md").read_text()
  assert "Verdict: reproduced." in text and "Rerun check: none yet" in text
  rerun = [
    {**r, "accuracy_after_rl": r["accuracy_after_rl"] - 0.2 * (r["arm"] == "method")}
    for r in recorded
  ]
  result = rerun_check.summarise(sweep, recorded, rerun, list(range(5)), {})
  rerun_check.write(str(tmp_path), "t", result, "cmd --check")
  report.write_report(str(tmp_path), sweep, recorded, "cmd", curves=False)
  lines = (tmp_path / "table.md").read_text().splitlines()
  i = next(i for i, l in enumerate(lines) if l.startswith("Claim: "))
  assert lines[i + 1].startswith("Rerun check (seed 0, 1, 2, 3, 4 on another machine")
  assert "not robust to this spread" in lines[i + 1]
  md = (tmp_path / "rerun.md").read_text()
  assert (
    "| method | 0 | accuracy_after_rl |" in md
    and "reproduced; with the rerun swapped in: contradicted" in md
  )


def test_the_environment_record_names_the_commit_the_cpu_and_the_lock(tmp_path):
  rec = environment.record(
    backend="local", workers=2, cpu_threads=1, started=environment.now(), jobs_run=3, jobs_cached=1
  )
  head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
  assert rec["commit"] == (head.stdout.strip() or "unknown")
  assert rec["layout"] == {"backend": "local", "workers": 2, "cpu_threads": 1, "pool_threads": 1}
  assert rec["cpu"]["cores"] == os.cpu_count() and rec["versions"]["jax"]
  assert "--xla_cpu_enable_platform_dependent_math=false" in rec["xla_flags"]
  # the lock: a fake one that pins jax to another version is reported as differing
  import jax

  lock = tmp_path / "requirements.lock"
  lock.write_text(f"jax==0.0.1 \\\n    --hash=sha256:00\nnumpy=={np.__version__}\n")
  state = environment.lock_state(str(lock))
  assert state["found"] and not state["matches"]
  assert state["differs"] == {"jax": ["0.0.1", jax.__version__]}
  assert environment.read_lock(str(lock)) == {"jax": "0.0.1", "numpy": np.__version__}
  environment.append(str(tmp_path), rec)
  assert json.loads((tmp_path / environment.FILE).read_text())["jobs_run"] == 3
  assert "1 XLA:CPU thread(s) per run" in environment.describe(rec)


def test_dirty_counts_code_changes_not_rewritten_tables(tmp_path):
  def git(*args):
    subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

  git("init", "-q")
  (tmp_path / "results" / "t").mkdir(parents=True)
  (tmp_path / "results" / "t" / "table.md").write_text("a\n")
  (tmp_path / "lib.py").write_text("x = 1\n")
  git("add", "-A")
  git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
  assert environment.git_state(str(tmp_path))["dirty"] is False
  (tmp_path / "results" / "t" / "table.md").write_text("b\n")
  (tmp_path / "results" / "t" / "rerun.md").write_text("new\n")
  (tmp_path / "run").mkdir()
  assert environment.git_state(str(tmp_path))["dirty"] is False
  (tmp_path / "lib.py").write_text("x = 2\n")
  state = environment.git_state(str(tmp_path))
  assert state["dirty"] is True and len(state["commit"]) == 40


def test_the_lock_pins_every_dependency_with_hashes():
  import tomllib

  with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
  locked = environment.read_lock(os.path.join(REPO, environment.LOCK))
  names = {
    environment.normalise(d.split("[")[0].split("=")[0].split(">")[0].split("<")[0]) for d in deps
  }
  assert names <= set(locked), sorted(names - set(locked))
  text = open(os.path.join(REPO, environment.LOCK)).read()
  entries = [b for b in text.split("\n") if b and b[0].isalnum()]
  assert len(entries) == len(locked)
  for block in text.split("\n")[:200]:
    if block and block[0].isalnum():
      assert block.rstrip().endswith("\\"), block  # each entry continues with its hashes
  assert text.count("--hash=sha256:") >= len(locked)


def test_every_table_folder_carries_an_environment_record():
  results = os.path.join(REPO, "results")
  tables = [
    d for d in sorted(os.listdir(results)) if os.path.exists(os.path.join(results, d, "runs.jsonl"))
  ]
  assert tables
  missing = [d for d in tables if not os.path.exists(os.path.join(results, d, environment.FILE))]
  assert not missing, missing


def test_the_largest_change_is_read_in_units_of_each_metric_s_seed_spread():
  sweep, recorded = _sweep(), _runs(0.1)
  sweep.metrics = ("accuracy_after_rl", "tokens")
  sweep.claim.parts = [
    dict(arm="method", versus="base", metric=m, direction="higher")
    for m in ("accuracy_after_rl", "tokens")
  ]
  for r in recorded:  # a metric on a scale 1000x larger, varying 1000x more between seeds
    r["tokens"] = 1000.0 * r["accuracy_after_rl"]
  # the rerun moves tokens by 5 (0.005 of its scale) and accuracy by 0.05 (0.05 of its)
  rerun = [
    {**r, "accuracy_after_rl": r["accuracy_after_rl"] + 0.05, "tokens": r["tokens"] + 5}
    for r in recorded
    if r["seed"] == 0
  ]
  result = rerun_check.summarise(sweep, recorded, rerun, [0], {})
  top, tested = rerun_check.largest(result)
  assert tested and top[0] == "accuracy_after_rl"  # not tokens, the larger absolute change
  # a check written before the SD was recorded falls back to the absolute change
  old = {
    **result,
    "spread": {
      m: {k: v for k, v in e.items() if k not in ("seed_sd", "relative")}
      for m, e in result["spread"].items()
    },
  }
  assert rerun_check.largest(old)[0][0] == "tokens"


def _clock_sweep():
  """_sweep with a timed metric, ``time_s``, declared a clock metric and tested by the claim."""
  sweep = _sweep()
  sweep.metrics = ("accuracy_after_rl", "time_s")
  sweep.clock_metrics = ("time_s",)
  sweep.claim.parts = [
    dict(arm="method", versus="base", metric="accuracy_after_rl", direction="higher"),
    dict(arm="method", versus="base", metric="time_s", direction="lower"),
  ]
  return sweep


def _timed(runs):
  return [{**r, "time_s": 10.0 + r["seed"] - 2.0 * (r["arm"] == "method")} for r in runs]


def test_a_rerun_that_differs_only_on_the_clock_says_so():
  sweep, recorded = _clock_sweep(), _timed(_runs(0.1))
  rerun = [{**r, "time_s": r["time_s"] + 3.0} for r in recorded if r["seed"] == 0]
  result = rerun_check.summarise(sweep, recorded, rerun, [0], {"rerun_environment": {}})
  assert result["clock_metrics"] == ["time_s"]
  assert not result["identical"] and rerun_check.identical_off_clock(result)
  line = rerun_check.table_line(result)
  assert "identical but for its clock metrics, which no setting fixes: the largest change " in line
  assert "3 in time_s" in line and "the rerun differs" not in line
  md = rerun_check.markdown("t", result, "cmd --check")
  assert "- Clock metrics (timed, or decided by a budget of CPU seconds): time_s." in md
  # without the declaration, the same rerun merely differs, and time_s is its largest change
  assert not rerun_check.identical_off_clock({**result, "clock_metrics": []})
  assert "the rerun differs; the largest change on the claim's metrics 3 in time_s" in (
    rerun_check.table_line({**result, "clock_metrics": []})
  )


def test_the_largest_change_skips_clock_metrics_and_reports_them_beside():
  sweep, recorded = _clock_sweep(), _timed(_runs(0.1))
  # time_s moves by many of its seed SDs, accuracy by a little: accuracy is the largest change
  rerun = [
    {**r, "accuracy_after_rl": r["accuracy_after_rl"] + 0.01, "time_s": r["time_s"] + 30.0}
    for r in recorded
    if r["seed"] == 1
  ]
  result = rerun_check.summarise(sweep, recorded, rerun, [1], {"rerun_environment": {}})
  (metric, _), tested = rerun_check.largest(result)
  assert (metric, tested) == ("accuracy_after_rl", True)
  assert rerun_check.largest(result, clock=True)[0][0] == "time_s"
  line = rerun_check.table_line(result)
  head, clock = line.split("; on the clock, the largest change ")
  assert "the largest change on the claim's metrics 0.01 in accuracy_after_rl" in head
  assert clock.startswith("on the claim's metrics 30 in time_s (")
  assert index_line(result).startswith("largest change 0.01 in accuracy_after_rl")
  only_clock = [{**r, "time_s": r["time_s"] + 30.0} for r in recorded if r["seed"] == 1]
  result = rerun_check.summarise(sweep, recorded, only_clock, [1], {"rerun_environment": {}})
  assert index_line(result).startswith("identical but for clock metrics: largest change 30")


def index_line(result) -> str:
  """The README index's few words on a check (sweeps/index.py), for ``result``."""
  return index._rerun_words(result)


def test_clock_metrics_must_be_metrics_the_table_reports():
  kw = dict(
    title="t",
    arms=("a", "b"),
    baseline="a",
    claim=dict(text="b beats a", arm="b", metric="acc", direction="higher"),
    metrics=("acc", "time_s"),
  )
  assert defaults.sweep(**kw, clock_metrics=("time_s",)).clock_metrics == ("time_s",)
  with pytest.raises(ValueError, match=r"clock_metrics \['wall_s'\] are not among"):
    defaults.sweep(**kw, clock_metrics=("wall_s",))
