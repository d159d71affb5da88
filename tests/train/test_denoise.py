"""DenoiseRL (train/denoise.py; methods_B.md section 15 (d)): prefixes only from wrong traces,
cut at step boundaries, masked out of the loss, the reward on the continuation alone, rho = 0
as GRPO, and the run from its config."""

import os
import shutil
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posttrain_jax import defaults, envs, models, rewards, rollout
from posttrain_jax import io as ptio
from posttrain_jax import methods as methods_lib
from posttrain_jax.methods import validate as validate_config
from posttrain_jax.methods.denoise import prefixes as denoise
from posttrain_jax.registry import ConfigError
from tests.train import rl_fixtures

ENV = envs.ENVS["chain"]
TOKENIZER = models.build_char_tokenizer(envs.tokenizer_charset("chain"))
P = ENV.make(7, (("+", 5), ("*", 3), ("-", 9)))  # 7+5=2;2*3=6;6-9=7;#7


def test_cut_prefix_keeps_whole_steps():
  wrong = "7+5=3;3*3=9;9-9=0;#0"  # three steps, then the answer
  assert denoise.cut_prefix(wrong, 0.0, ";") == ""
  assert denoise.cut_prefix(wrong, 0.1, ";") == "7+5=3;"  # at least one step
  assert denoise.cut_prefix(wrong, 0.5, ";") == "7+5=3;3*3=9;"  # round(1.5) = 2
  assert denoise.cut_prefix(wrong, 1.0, ";") == "7+5=3;3*3=9;9-9=0;"  # never the answer
  assert denoise.cut_prefix("7+5=3", 0.5, ";") == ""  # no complete step
  assert denoise.cut_prefix(wrong, 0.25, "") == wrong[:5]  # characters


def test_noisy_rows_are_the_last_of_each_group():
  group = np.repeat(np.arange(3), 4)
  np.testing.assert_array_equal(
    denoise.noisy_rows(group, 0.5), np.tile([False, False, True, True], 3)
  )
  assert not denoise.noisy_rows(group, 0.0).any()
  assert denoise.noisy_rows(group, 1.0).all()


class _FakeWeak:
  """A weak 'sampler' that answers with fixed texts, row by row."""

  def __init__(self, texts):
    self.texts = texts

  def sample(self, params, tokens, mask, key):
    ids = [TOKENIZER(t, add_special_tokens=False)["input_ids"] for t in self.texts]
    T = max(map(len, ids)) + 1
    comp = np.zeros((len(ids), T), np.int32)
    for i, x in enumerate(ids):
      comp[i, : len(x)] = x
    return types.SimpleNamespace(completion=comp)


def _ctx():
  config = defaults.base_config()
  config.env.name = "chain"
  return types.SimpleNamespace(
    tokenizer=TOKENIZER,
    prompt_texts=lambda ps: [p.prompt for p in ps],
    prompt_len=16,
    config=config,
    scorer=rewards.Scorer(workers=0, timeout=5.0, max_error_rate=1.0),
  )


def test_prefixes_come_only_from_wrong_traces():
  problems = [P, ENV.make(1, (("+", 1), ("+", 1), ("+", 1)))]  # 1+1=2;2+1=3;3+1=4;#4
  right0, wrong0 = ENV.reference(problems[0]), "7+5=3;3*3=9;9-9=0;#0"
  right1 = ENV.reference(problems[1])
  # Problem 0: right, then wrong (kept); problem 1: right twice (no prefix).
  weak = denoise.Weak(_FakeWeak([right0, wrong0, right1, right1]).sample, None)
  traces = denoise.wrong_traces(_ctx(), weak, ENV, problems, jax.random.key(0), tries=2)
  assert traces == [wrong0, None]
  group = np.repeat([0, 1], 4)
  ctx = _ctx()
  ctx.config.rl.max_new_tokens = 24
  ctx.config.rl.denoise.tries = 2
  ids, lengths, m = denoise.prefixes(
    ctx, weak, ENV, problems, group, jax.random.key(0), rho=0.5, fraction=0.5
  )
  np.testing.assert_array_equal(lengths, [0, 0, 12, 12, 0, 0, 0, 0])
  assert TOKENIZER.decode(list(ids[2, :12])) == "7+5=3;3*3=9;"
  assert m["denoise/noisy_rows"] == 0.25 and m["denoise/weak_wrong"] == 0.5
  _, lengths, _ = denoise.prefixes(
    ctx, weak, ENV, problems, group, jax.random.key(0), rho=0.0, fraction=0.5
  )
  assert not lengths.any()  # rho = 0: no prefix at all, GRPO's rows


def test_the_reward_reads_the_continuation_not_an_answer_inside_the_prefix():
  def ids(text):
    return TOKENIZER(text, add_special_tokens=False)["input_ids"]

  # The prefix holds the right answer (#7); the continuation ends on a wrong one, and back.
  rows = [ids("7+5=2;#7") + ids("2*3=6;#6"), ids("7+5=3;#0") + ids("2*3=6;6-9=7;#7")]
  comp = np.zeros((2, 24), np.int32)
  for i, r in enumerate(rows):
    comp[i, : len(r)] = r
  lengths = np.asarray([8, 8])
  texts = rollout.decode_completions(TOKENIZER, rollout.continuation_only(comp, lengths, 0))
  assert texts == ["2*3=6;#6", "2*3=6;6-9=7;#7"]
  assert [ENV.verify(P, t) for t in texts] == [0.0, 1.0]
  full = rollout.decode_completions(TOKENIZER, comp)
  assert [ENV.verify(P, t) for t in full] == [0.0, 1.0]  # and the whole text would agree here,
  # but a continuation with no answer of its own scores 0, not the prefix's answer:
  only = rollout.decode_completions(TOKENIZER, rollout.continuation_only(comp[:1, :8], [8], 0))
  assert ENV.verify(P, only[0]) == 0.0 and ENV.verify(P, "7+5=2;#7") == 1.0


def test_the_prefix_is_out_of_the_loss_unless_unmasked():
  T = 6
  own = jnp.asarray([[0, 0, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]], jnp.float32)
  ro = rollout.Rollout(
    tokens=jnp.zeros((2, 2 + T), jnp.int32),
    prompt_mask=jnp.ones((2, 2)),
    completion_mask=own,
    logprobs=jnp.zeros((2, T)),
    lengths=jnp.asarray([3, 3]),
    truncated=jnp.zeros(2, bool),
    group=jnp.arange(2),
    policy_version=jnp.zeros(2, jnp.int32),
    env_mask=jnp.asarray([[1, 1, 0, 0, 0, 0], [0] * 6], jnp.float32),
  )
  lengths = np.asarray([2, 0])
  assert denoise.loss_rollout(ro, lengths, True) is ro
  out = denoise.loss_rollout(ro, lengths, False)
  np.testing.assert_array_equal(out.completion_mask, [[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]])
  np.testing.assert_array_equal(out.lengths, [5, 3])


def _config(arm="denoise", steps=2):
  import importlib.util

  spec = importlib.util.spec_from_file_location(
    "denoise_exp", os.path.join(rl_fixtures.REPO, "experiments", "denoise.py")
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config(f"arm={arm},smoke")
  c.progress = False
  c.rl.update(steps=steps, eval_every=0, checkpoint_every=2)
  return c


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
  """A workdir whose pretraining and weak (teacher) stages are done."""
  workdir = str(tmp_path_factory.mktemp("denoise_stages"))
  c = _config()
  c.stages = ("pretrain", "teacher")
  methods_lib.run(c, workdir)
  return workdir


def _run(stages, tmp_path, name, arm):
  workdir = str(tmp_path / name)
  shutil.copytree(stages, workdir)
  summary = methods_lib.run(_config(arm), workdir)
  recs = [r for r in ptio.read_jsonl(os.path.join(workdir, "rl", "metrics.jsonl")) if r["step"] > 0]
  return recs, summary


def test_runs_from_config_with_masked_and_unmasked_prefixes(stages, tmp_path):
  masked, summary = _run(stages, tmp_path, "masked", "denoise")
  assert all(r["denoise/noisy_rows"] > 0 and r["denoise/prefix_tokens"] > 0 for r in masked)
  assert "recovery_after_rl" in summary and "recovery_before_rl" in summary
  unmasked, _ = _run(stages, tmp_path, "unmasked", "denoise_unmasked")
  # Same rollouts (same seed, same prefixes); the unmasked loss also counts the prefix tokens.
  for a, b in zip(masked, unmasked):
    assert a["denoise/prefix_tokens"] == b["denoise/prefix_tokens"]
  assert unmasked[0]["loss/pg_den"] > masked[0]["loss/pg_den"]  # tokens the loss saw


def test_rho_zero_is_grpo_on_the_same_sampler(stages, tmp_path):
  grpo, _ = _run(stages, tmp_path, "grpo", "grpo")
  assert all(r["denoise/noisy_rows"] == 0.0 for r in grpo)
  no_rows = _config("denoise")
  no_rows.rl.denoise.fraction = 0.0
  workdir = str(tmp_path / "fraction0")
  shutil.copytree(stages, workdir)
  methods_lib.run(no_rows, workdir)
  other = [
    r for r in ptio.read_jsonl(os.path.join(workdir, "rl", "metrics.jsonl")) if r["step"] > 0
  ]
  strip = lambda recs: [{k: v for k, v in r.items() if not k.startswith("denoise/")} for r in recs]
  rl_fixtures.assert_same_records(strip(grpo), strip(other), "rho 0 vs fraction 0")
  denoised, _ = _run(stages, tmp_path, "denoised", "denoise")
  assert denoised[0]["loss/pg_den"] < grpo[0]["loss/pg_den"]  # prefix tokens are not trained


def test_bad_denoise_configs_are_refused():
  c = _config("denoise_unmasked")
  c.rl.old_logprobs = "behaviour"
  with pytest.raises(ConfigError, match="recomputed"):
    validate_config(c)
  c = _config()
  c.stages = ("pretrain", "rl", "eval")  # the teacher's check speaks first (METHODS order)
  with pytest.raises(ConfigError, match=r"add 'teacher' to config.stages"):
    validate_config(c)
  c = _config()
  c.rl.denoise.rho = 1.5
  with pytest.raises(ConfigError, match="rl.denoise.rho"):
    validate_config(c)
