"""scripts/analyze.py plasticity on a finished run: SFT on the env's gold rows lowers their loss
and raises the model's confidence on them, the first stage's gradient cosine is 1, a run's
top-changed neurons overlap fully with its own, and a folder without a run exits 2.
``representations``: the last layer's lens agrees with the model, the first stage's CKA with
itself is 1 and SFT moves it."""

import json
import os
import sys

import pytest

from posttrain_jax import methods as methods_lib
from posttrain_jax.sweeps import runner

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import analyze as analyze_script  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  c = runner.load_config_module(os.path.join(REPO, "experiments", "quickstart.py")).get_config(
    "smoke"
  )
  c.progress = False
  c.stages = ("pretrain", "sft")
  c.sft.update(source="env", examples=64, batch_size=16, epochs=6, lr=3e-3)
  workdir = str(tmp_path_factory.mktemp("analyze") / "run")
  methods_lib.run(c, workdir)
  return workdir


def test_plasticity_table_of_pretrain_and_sft(run, capsys):
  code = analyze_script.main(
    ["plasticity", run, "--stages", "pretrain", "sft", "--examples", "64", "--against", run]
  )
  assert code == 0
  out = json.load(open(os.path.join(run, "analysis", "plasticity.json"), encoding="utf-8"))
  pre, tuned = out["rows"]
  assert pre["stage"] == "pretrain" and pre["grad_cos_first"] == pytest.approx(1.0)
  assert tuned["loss"] < 0.8 * pre["loss"]  # the same gold transcripts SFT trained on
  assert tuned["max_prob"] > pre["max_prob"] and tuned["entropy"] < pre["entropy"]
  assert tuned["grad_cos_first"] < 0.999
  assert out["neuron_overlap"]["overlap"] == 1.0 and out["neuron_overlap"]["stage"] == "sft"
  md = open(os.path.join(run, "analysis", "plasticity.md"), encoding="utf-8").read()
  assert "| sft |" in md and "shared with" in md
  assert "| pretrain |" in capsys.readouterr().out


def test_representations_of_pretrain_and_sft(run, capsys):
  code = analyze_script.main(["representations", run, "--stages", "pretrain", "sft"])
  assert code == 0
  out = json.load(open(os.path.join(run, "analysis", "representations.json"), encoding="utf-8"))
  rows = {(r["stage"], r["layer"]): r for r in out["rows"]}
  layers = max(r["layer"] for r in out["rows"])
  assert len(rows) == 2 * (layers + 1)
  for stage in ("pretrain", "sft"):  # the last layer's lens is the model's own first token
    assert rows[stage, layers]["lens_agree"] == 1.0
  for layer in range(1, layers + 1):  # the first stage against itself, and the SFT's move
    assert rows["pretrain", layer]["cka_first"] == pytest.approx(1.0, abs=1e-5)
  assert min(rows["sft", layer]["cka_first"] for layer in range(1, layers + 1)) < 0.999
  assert os.path.exists(os.path.join(run, "analysis", "representations.png"))
  assert "| sft |" in capsys.readouterr().out


def test_a_folder_without_a_run_exits_2(tmp_path, capsys):
  assert analyze_script.main(["plasticity", str(tmp_path), "--stages", "pretrain"]) == 2
  assert "holds no run" in capsys.readouterr().err


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
  """experiments/pipeline.py (smoke): RL on addition, a merge, RL on digit sums."""
  c = runner.load_config_module(os.path.join(REPO, "experiments", "pipeline.py")).get_config(
    "smoke"
  )
  workdir = str(tmp_path_factory.mktemp("domains") / "run")
  methods_lib.run(c, workdir)
  return workdir


def test_domains_table_scores_every_domain_after_every_stage_with_the_damage(pipeline, capsys):
  stages = ["pretrain", "rl_add", "merge", "rl_sum"]
  args = ["domains", pipeline, "--stages", *stages, "--domains", "arithmetic", "digit_sum"]
  assert analyze_script.main([*args, "--examples", "32"]) == 0
  out = json.load(open(os.path.join(pipeline, "analysis", "domains.json"), encoding="utf-8"))
  assert [r["stage"] for r in out["rows"]] == stages
  assert len(out["damage"]) == 3 * 2
  rows = {r["stage"]: r for r in out["rows"]}
  for x in out["damage"]:
    assert x["predicted"] == pytest.approx(x["first_order"] + x["second_order"], abs=1e-6)
    d = x["domain"]
    assert x["measured"] == pytest.approx(
      rows[x["stage"]][f"nll/{d}"] - rows[x["after"]][f"nll/{d}"], abs=1e-4
    )
    assert x["accuracy_change"] == pytest.approx(
      rows[x["stage"]][f"accuracy/{d}"] - rows[x["after"]][f"accuracy/{d}"]
    )
  # the merge halves the RL update: its change from rl_add is the opposite of half of rl_add's
  merged = [x for x in out["damage"] if x["stage"] == "merge"]
  assert all(abs(x["measured"]) > 0 for x in merged)
  assert -1.0 <= out["spearman_predicted_measured"] <= 1.0
  md = capsys.readouterr().out
  assert "| rl_sum | digit_sum |" in md and "Spearman" in md


def test_domains_needs_the_domains(pipeline, capsys):
  assert analyze_script.main(["domains", pipeline, "--stages", "pretrain"]) == 2
  assert "needs --domains" in capsys.readouterr().err


def test_collect_averages_runs_stage_by_stage(run, tmp_path, capsys):
  first = os.path.join(run, "analysis", "plasticity.json")
  assert (
    analyze_script.main(["plasticity", run, "--stages", "pretrain", "sft", "--examples", "16"]) == 0
  )
  second = str(tmp_path / "second.json")
  os.replace(os.path.join(run, "analysis", "plasticity.json"), second)
  assert (
    analyze_script.main(["plasticity", run, "--stages", "pretrain", "sft", "--examples", "64"]) == 0
  )
  out = str(tmp_path / "all.md")
  assert analyze_script.main(["collect", out, first, second, "--title", "Two runs"]) == 0
  a, b = (json.load(open(p, encoding="utf-8"))["rows"] for p in (first, second))
  text = open(out, encoding="utf-8").read()
  assert text.startswith("# Two runs") and "2 runs" in text
  loss_mean = (a[1]["loss"] + b[1]["loss"]) / 2
  (sft_line,) = [x for x in text.splitlines() if x.startswith("| sft |")]
  assert f" {loss_mean:.4g} ({a[1]['loss']:.3g}, {b[1]['loss']:.3g}) |" in sft_line
  assert analyze_script.main(["collect", out, str(tmp_path / "missing.json")]) == 2
  capsys.readouterr()
