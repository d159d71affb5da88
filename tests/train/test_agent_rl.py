"""Multi-turn tool-use GRPO from a config (config.agent): a nano model pretrained to call the
calculator on long_mult, its rollouts' masks against the transcripts' own segments, the run's
agent metrics, a resumed run equal to an uninterrupted one, and tools that raise or hang."""

import os
import shutil
import time

import jax
import numpy as np
import pytest

from posttrain_jax import defaults, envs, rollout
from posttrain_jax import io as ptio
from posttrain_jax import methods as methods_lib
from posttrain_jax.envs import tool_calls
from posttrain_jax.methods import validate as validate_config
from posttrain_jax.train import samplers as agents
from posttrain_jax.train import workdir as workdir_lib
from tests.train import rl_fixtures


def agent_config(rl_steps=4, **agent):
  """Nano on long_mult level 2, pretrained 300 steps on the clean corpus (every transcript
  calls the calculator), then multi-turn GRPO."""
  c = defaults.make_smoke(defaults.base_config())
  c.env.update(name="long_mult", level=2)
  c.stages = ("pretrain", "rl")
  c.progress = False
  c.pretrain.update(
    steps=300,
    batch_size=32,
    lr=3e-3,
    corpus_noise=0.0,
    eval_every=300,
    eval_problems=16,
    checkpoint_every=300,
  )
  c.rl.update(
    steps=rl_steps,
    eval_every=0,
    checkpoint_every=2,
    prompts_per_step=4,
    group_size=4,
    max_new_tokens=48,
    lr=3e-4,
  )
  c.agent.update(
    dict(tools=("calculator",), max_turns=3, max_obs_chars=16, tool_timeout_s=0.5), **agent
  )
  return c


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  """A workdir whose pretraining stage is done (each test copies it and runs RL there)."""
  workdir = str(tmp_path_factory.mktemp("agent_pretrain"))
  c = agent_config()
  c.stages = ("pretrain",)
  methods_lib.run(c, workdir)
  return workdir


def _copy(src, tmp_path, name):
  out = str(tmp_path / name)
  shutil.copytree(src, out)
  return out


def _rl_records(workdir):
  return [r for r in ptio.read_jsonl(os.path.join(workdir, "rl", "metrics.jsonl")) if r["step"] > 0]


def _sampler_and_params(workdir, **agent):
  c = agent_config(**agent)
  validate_config(c)
  ctx = methods_lib.make_context(c, workdir)
  params = ctx.load_final("pretrain")
  cfg = ctx.sampler_config(temperature=1.0, max_new_tokens=c.rl.max_new_tokens)
  return ctx, agents.make_sampler(ctx, cfg), params


# Libra's C-MLFQ (config.agent.buckets): a first level of 6-token quanta that demotes after
# one call, so episodes move between batches mid-turn and mid-observation.
BUCKETS = ((8, 6, 1), (4, 12, 0), (8, 48, 0))


@pytest.mark.parametrize("levels", [(), BUCKETS])
def test_rollout_masks_equal_the_transcripts_segments(pretrained, levels):
  """Each row's own/env masks, read as characters (a char tokenizer), are exactly the model /
  observation segments split_transcript finds in the row's text, and every observation is
  the calculator's answer to the call before it; also when the rows are scheduled in buckets
  (episodes continued from their transcripts in later batches)."""
  ctx, sampler, params = _sampler_and_params(pretrained, buckets=levels)
  problems = ctx.env.sample(jax.random.key(0), 16, level=2)
  tokens, mask = rollout.encode_prompts(
    ctx.tokenizer, [p.prompt for p in problems], length=ctx.prompt_len
  )
  ro = agents.sample(sampler, params, tokens, mask, jax.random.key(1), problems=problems)
  comp, own, env = (np.asarray(x) for x in (ro.completion, ro.completion_mask, ro.env_mask))
  calls = 0
  for b in range(len(problems)):
    real = (own[b] + env[b]) > 0
    ids = comp[b][real]
    text = ctx.tokenizer.decode(list(ids), skip_special_tokens=False)
    eos = text.endswith("<eos>")
    text = text.removesuffix("<eos>")
    flags = np.concatenate(
      [np.full(len(seg), m) for seg, m in tool_calls.split_transcript(text)] or [np.zeros(0, bool)]
    )
    flags = np.concatenate([flags, [True]]) if eos else flags
    np.testing.assert_array_equal(flags, own[b][real] > 0)
    segments = tool_calls.split_transcript(text)
    # an observation the token budget cuts ends the row (a truncated completion)
    budget_hit = not eos and int(real.sum()) == ctx.config.rl.max_new_tokens
    for i, ((call, _), (seg, is_model)) in enumerate(zip(segments, segments[1:])):
      if not is_model:
        calls += 1
        cut = budget_hit and i + 2 == len(segments) and not seg.endswith("</obs>")
        assert seg.startswith("<obs>") and (cut or seg.endswith("</obs>")), (call, seg)
        parsed = tool_calls.parse(call)
        if isinstance(parsed, tool_calls.Call) and parsed.name == "calculator":
          answer = envs.make_tool("calculator")(parsed.args)
          rendered = tool_calls.render_observation(answer.text, 16)
          assert rendered.startswith(seg) if cut else seg == rendered, (call, seg)
  assert calls >= 8  # the pretrained model calls the tool
  if levels:
    assert max(map(len, sampler.fn.history)) >= 2  # some episode was demoted


@pytest.mark.parametrize("levels", [(), BUCKETS])
def test_run_logs_calls_and_trains_only_model_tokens(pretrained, tmp_path, levels):
  workdir = _copy(pretrained, tmp_path, "run")
  methods_lib.run(agent_config(buckets=levels), workdir)
  recs = _rl_records(workdir)
  assert [r["step"] for r in recs] == [1, 2, 3, 4]
  for r in recs:
    assert r["agent/call_rate"] > 0.5 and r["agent/tool_calls"] >= r["agent/call_rate"]
    assert r["agent/tool_errors"] < r["agent/tool_calls"]
    assert r["agent/obs_tokens"] > 0
  assert max(r["reward/mean"] for r in recs) > 0  # copying the observation is rewarded


def test_resumed_run_equals_an_uninterrupted_one(pretrained, tmp_path):
  full = _copy(pretrained, tmp_path, "full")
  methods_lib.run(agent_config(4), full)
  cut = _copy(pretrained, tmp_path, "cut")
  methods_lib.run(agent_config(2), cut)
  # As if killed right after the step-2 checkpoint of a 4-step run.
  workdir_lib.write_config(cut, agent_config(4))
  os.remove(os.path.join(cut, "rl", "done.json"))
  shutil.rmtree(os.path.join(cut, "rl", "final"))
  methods_lib.run(agent_config(4), cut)
  rl_fixtures.assert_same_records(_rl_records(full), _rl_records(cut), "agent resume")


@pytest.mark.parametrize("kind", ["raises", "hangs"])
def test_a_tool_that_raises_or_hangs_gives_errors_and_the_run_goes_on(
  pretrained, tmp_path, monkeypatch, kind
):
  def broken(args):
    if kind == "hangs":
      time.sleep(30)
    raise RuntimeError("calculator is down")

  monkeypatch.setitem(envs.TOOLS, "calculator", broken)
  workdir = _copy(pretrained, tmp_path, kind)
  start = time.monotonic()
  methods_lib.run(agent_config(2), workdir)
  recs = _rl_records(workdir)
  assert [r["step"] for r in recs] == [1, 2]
  for r in recs:
    assert r["agent/tool_calls"] > 0
    assert r["agent/tool_errors"] == pytest.approx(r["agent/tool_calls"])
    assert r["reward/mean"] < 0.2  # the answer is no longer in the observation
  if kind == "hangs":
    assert time.monotonic() - start < 120
