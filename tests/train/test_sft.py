"""The sft stage (train/sft.py) and the weight-space operators as modelop stages between any two
stages: data from a JSONL file or the env, passes over a seeded permutation, the loss on the
completion only, and pretrain -> sft -> fuse -> reset_neurons -> rollback -> eval from one
config, untouched parameters bit for bit."""

import json
import os

import jax
import numpy as np
import pytest

from posttrain_jax import methods as methods_lib
from posttrain_jax import models
from posttrain_jax.envs.base import DatasetError
from posttrain_jax.modelops.anchored import leaf_name
from posttrain_jax.sweeps import runner
from posttrain_jax.train import experiment, sft
from posttrain_jax.train import pretrain as pretrain_lib

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _write(path, lines):
  path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
  return str(path)


# -- data -----------------------------------------------------------------------------------------
def test_read_examples_takes_prompt_completion_lines_and_skips_blank_ones(tmp_path):
  path = _write(
    tmp_path / "a.jsonl",
    ['{"prompt": "1+2=", "completion": "3"}', "", '{"prompt": "", "completion": "x"}'],
  )
  assert sft.read_examples(path) == [("1+2=", "3"), ("", "x")]


@pytest.mark.parametrize(
  "line, message",
  [
    ("{not json", "a.jsonl:2: invalid JSON"),
    ("[1, 2]", "a.jsonl:2: a line must be a JSON object"),
    ('{"completion": "3"}', 'a.jsonl:2: needs a string "prompt"'),
    ('{"prompt": "1+2="}', 'a.jsonl:2: needs a non-empty string "completion"'),
    ('{"prompt": "1+2=", "completion": ""}', 'a.jsonl:2: needs a non-empty string "completion"'),
  ],
)
def test_a_malformed_line_is_named_with_its_line_number(tmp_path, line, message):
  path = _write(tmp_path / "a.jsonl", ['{"prompt": "1+1=", "completion": "2"}', line])
  with pytest.raises(DatasetError, match=message):
    sft.read_examples(path)


def test_a_missing_or_empty_file_says_what_to_give(tmp_path):
  with pytest.raises(DatasetError, match="is no file; give a JSONL file"):
    sft.read_examples(str(tmp_path / "nope.jsonl"))
  with pytest.raises(DatasetError, match="holds no examples"):
    sft.read_examples(_write(tmp_path / "e.jsonl", ["", "  "]))


def test_every_pass_sees_every_example_and_passes_differ():
  key = jax.random.key(3)
  n, b = 10, 4  # 3 steps a pass, the last wrapping to the pass's start
  per = sft.steps_per_epoch(n, b)
  assert per == 3
  passes = [
    np.concatenate([sft.batch_indices(key, e * per + i, n, b) for i in range(per)])
    for e in range(3)
  ]
  for order in passes:
    assert set(order.tolist()) == set(range(n)) and len(order) == per * b
    np.testing.assert_array_equal(order[n:], order[: per * b - n])  # the wrap
  assert not np.array_equal(passes[0], passes[1])
  np.testing.assert_array_equal(sft.batch_indices(key, 4, n, b), sft.batch_indices(key, 4, n, b))


def test_the_loss_mask_covers_the_completion_and_eos_only():
  tok = models.build_char_tokenizer("0123456789+=")
  out = pretrain_lib.tokenize_pairs(tok, [("12+7=", "19"), ("1+1=", "2")], 9)
  eos, pad = tok.eos_token_id, tok.pad_token_id
  assert out["tokens"][0].tolist()[5:] == [*tok("19")["input_ids"], eos, pad]
  np.testing.assert_array_equal(out["loss_mask"][0], [0, 0, 0, 0, 0, 1, 1, 1, 0])
  np.testing.assert_array_equal(out["loss_mask"][1], [0, 0, 0, 0, 1, 1, 0, 0, 0])


def test_characters_the_tokenizer_lacks_are_named():
  tok = models.build_char_tokenizer("0123456789+=")
  with pytest.raises(DatasetError, match=r"characters the tokenizer does not know \('ab'\)"):
    sft.check_vocabulary(tok, [("1+1=", "2"), ("a+b=", "2")], "f.jsonl")


# -- a run: pretrain -> sft (a file) -> modelops -> eval -----------------------------------------
EXAMPLES = [(f"{a}+{b}=", str(a + b)) for a in range(10) for b in range(0, 10, 3)]


def _config(data):
  c = runner.load_config_module(os.path.join(REPO, "experiments", "quickstart.py")).get_config(
    "smoke"
  )
  c.progress = False
  c.stages = ("pretrain", "sft", "fuse", "reset", "rollback", "eval")
  c.sft.update(source=data, batch_size=8, epochs=3, lr=3e-3, eval_every=0, checkpoint_every=2)
  c.stage_specs = dict(
    fuse=dict(
      kind="modelop",
      op="fuse",
      inputs=("pretrain", "sft"),
      kwargs=dict(alpha=0.5, modules={"embed": 0.0}),
    ),
    reset=dict(
      kind="modelop",
      op="reset_neurons",
      inputs=("fuse", "pretrain"),
      kwargs=dict(fraction=0.25, mode="base"),
    ),
    rollback=dict(
      kind="modelop", op="rollback", inputs=("reset", "pretrain"), kwargs=dict(fraction=0.1)
    ),
  )
  return c


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("sft")
  data = str(tmp / "gold.jsonl")
  with open(data, "w", encoding="utf-8") as f:
    for p, c in EXAMPLES:
      f.write(json.dumps({"prompt": p, "completion": c}) + "\n")
  workdir = tmp / "run"
  return workdir, methods_lib.run(_config(data), str(workdir))


def _final(workdir, name):
  return experiment.load_final(str(workdir), name)[0]


def _leaves(tree):
  return {leaf_name(path): np.asarray(x) for path, x in jax.tree_util.tree_leaves_with_path(tree)}


def test_sft_runs_its_passes_and_lowers_the_completion_loss(sft_run):
  workdir, _ = sft_run
  recs = [json.loads(line) for line in open(workdir / "sft" / "metrics.jsonl", encoding="utf-8")]
  steps = [r for r in recs if "loss/nll" in r]
  assert len(steps) == 3 * sft.steps_per_epoch(len(EXAMPLES), 8) == 15
  assert steps[-1]["sft/epoch"] == pytest.approx(3.0)
  # tokens under the loss: each example's completion and EOS, never its prompt
  per_row = {len(c) + 1 for _, c in EXAMPLES}
  assert all(min(per_row) * 8 <= r["data/tokens"] <= max(per_row) * 8 for r in steps)
  assert np.mean([r["loss/nll"] for r in steps[-5:]]) < 0.8 * np.mean(
    [r["loss/nll"] for r in steps[:5]]
  )
  done = json.loads((workdir / "sft" / "done.json").read_text())
  assert done["examples"] == len(EXAMPLES) and done["steps"] == 15


def test_modelop_stages_apply_their_operators_and_leave_the_rest_bit_for_bit(sft_run):
  workdir, summary = sft_run
  pre, tuned = _leaves(_final(workdir, "pretrain")), _leaves(_final(workdir, "sft"))
  fused, reset, rolled = (_leaves(_final(workdir, n)) for n in ("fuse", "reset", "rollback"))
  for name in pre:
    if "embed" in name:  # alpha 0 on the embedding: the base's, bit for bit
      np.testing.assert_array_equal(fused[name], pre[name])
    else:
      want = pre[name].astype(np.float32) + 0.5 * (
        tuned[name].astype(np.float32) - pre[name].astype(np.float32)
      )
      np.testing.assert_allclose(fused[name], want.astype(pre[name].dtype), rtol=1e-6, atol=1e-7)
  assert any(not np.array_equal(fused[n], pre[n]) for n in pre)  # SFT moved something
  mlp = [
    n for n in pre if n.split("/")[-2 if n.endswith("value") else -1] in ("gate", "up", "down")
  ]
  for name in pre:  # the reset touches MLP neurons only, and puts them at the base
    if name not in mlp:
      np.testing.assert_array_equal(reset[name], fused[name])
    else:
      moved = reset[name] != fused[name]
      np.testing.assert_array_equal(reset[name][moved], pre[name][moved])
  # the rollback moves exactly 10% of all coordinates, each back to the pretrained value
  total = sum(x.size for x in pre.values())
  changed = sum(int(np.sum((rolled[n] != reset[n]) & (reset[n] != pre[n]))) for n in pre)
  kept = sum(int(np.sum(rolled[n] == reset[n])) for n in pre)
  assert changed + kept == total and changed <= round(0.1 * total)
  for n in pre:
    moved = rolled[n] != reset[n]
    np.testing.assert_array_equal(rolled[n][moved], pre[n][moved])
  done = json.loads((workdir / "rollback" / "done.json").read_text())
  assert done["op"] == "rollback" and done["inputs"] == ["reset", "pretrain"]
  assert "accuracy_after_rl" in summary and "accuracy_before_rl" in summary
