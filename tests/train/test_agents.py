"""methods/agent/tools.py: the host side of multi-turn rollouts (the responder over ToolEnvs, the
metrics, the config checks), on hand-written turns."""

import time

import ml_collections
import numpy as np
import pytest

from posttrain_jax import defaults, envs, models, rollout
from posttrain_jax import methods as methods_lib
from posttrain_jax.envs import tool_calls
from posttrain_jax.envs import tools as tools_lib
from posttrain_jax.methods import validate as validate_config
from posttrain_jax.methods.agent import tools as agents
from posttrain_jax.registry import ConfigError

TASK = envs.ENVS["long_mult"]
TOKENIZER = models.build_char_tokenizer(envs.tokenizer_charset("long_mult"))


def _agent_cfg(**kw):
  c = defaults.base_config().agent
  c.update(dict(tools=("calculator",), max_turns=3, max_obs_chars=16), **kw)
  return c


def _responder(n, *, tools=None, **kw):
  a = _agent_cfg(**kw)
  built = agents.build_tools(a) if tools is None else tools
  episodes = []
  for i in range(n):
    env = envs.ToolEnv(
      TASK,
      built,
      max_turns=a.max_turns,
      max_obs_chars=a.max_obs_chars,
      max_tool_failures=a.max_tool_failures or None,
    )
    env.reset(TASK.make(4821 + i, 907, 4))
    episodes.append(env)
  return agents.Responder(episodes, TOKENIZER, agents.obs_tokens(a))


def _ids(text):
  return np.asarray(TOKENIZER(text, add_special_tokens=False)["input_ids"])


def _text(ids):
  return TOKENIZER.decode(list(ids), skip_special_tokens=True)


def test_stop_ids_encode_the_call_close_tag():
  stop = agents.stop_ids(TOKENIZER)
  assert _text(stop) == "</tool>" and len(stop) == len("</tool>")
  with pytest.raises(ConfigError, match="cannot encode"):
    agents.stop_ids(models.build_char_tokenizer("0123456789+="))


def test_responder_answers_each_row_with_its_tools_observation():
  r = _responder(3)
  replies = r(
    np.asarray([0, 2]),
    [_ids("<tool>calculator(4821*907)</tool>"), _ids("<tool>calculator(4823*907)</tool>")],
  )
  assert [(_text(ids), end) for ids, end in replies] == [
    (f"<obs>{4821 * 907}</obs>", False),
    (f"<obs>{4823 * 907}</obs>", False),
  ]
  assert r.envs[1].turns == 0 and r.envs[0].turns == r.envs[2].turns == 1


def test_malformed_calls_are_answered_with_their_errors_and_the_row_goes_on():
  r = _responder(2, max_obs_chars=80)
  replies = r(np.asarray([0, 1]), [_ids("<tool>abacus(1)</tool>"), _ids("12)</tool>")])
  texts = [_text(ids) for ids, _ in replies]
  assert texts[0] == "<obs>error: unknown tool 'abacus'; tools: calculator</obs>"
  assert texts[1] == "<obs>error: </tool> without <tool> before it</obs>"
  assert [end for _, end in replies] == [False, False]


def test_a_tool_that_raises_or_hangs_gives_an_error_observation(monkeypatch):
  def boom(args):
    raise RuntimeError("no")

  def hang(args):
    time.sleep(5)
    return "late"

  built = {"calculator": tools_lib.Tool("calculator", boom, 1.0)}
  r = _responder(1, tools=built, max_obs_chars=64)
  ((ids, end),) = r(np.asarray([0]), [_ids("<tool>calculator(1*2)</tool>")])
  assert _text(ids) == "<obs>error: calculator raised RuntimeError: no</obs>" and not end
  built = {"calculator": tools_lib.Tool("calculator", hang, 0.2)}
  r = _responder(1, tools=built, max_obs_chars=64)
  start = time.monotonic()
  ((ids, end),) = r(np.asarray([0]), [_ids("<tool>calculator(1*2)</tool>")])
  assert time.monotonic() - start < 3
  assert _text(ids) == "<obs>error: calculator: timed out after 0.2 s</obs>"


def test_the_turn_cap_ends_the_row_after_its_observation():
  r = _responder(1, max_turns=2)
  call = _ids("<tool>calculator(2*3)</tool>")
  assert r(np.asarray([0]), [call])[0][1] is False
  ids, end = r(np.asarray([0]), [call])[0]
  assert _text(ids) == "<obs>6</obs>" and end is True


def test_failure_cap_ends_the_row():
  r = _responder(1, max_tool_failures=1, max_obs_chars=80)
  _, end = r(np.asarray([0]), [_ids("<tool>calculator(x)</tool>")])[0]
  assert end is True


def test_observations_are_cut_to_the_token_budget():
  r = _responder(1, max_obs_chars=16, max_obs_tokens=6)
  ids, _ = r(np.asarray([0]), [_ids("<tool>calculator(4821*907)</tool>")])[0]
  assert len(ids) == 6 and _text(ids) == "<obs>4" and r.cut == 1


def test_call_and_error_counts_from_a_hand_built_rollout():
  # Row 0: two observations (one an error); row 1: none; row 2: one at the very end.
  texts = [
    (
      "<tool>calculator(1*2)</tool>",
      "<obs>2</obs>",
      "<tool>x</tool>",
      "<obs>error: bad</obs>",
      "2",
    ),
    ("12",),
    ("<tool>c(1)</tool>", "<obs>1</obs>"),
  ]
  T = 96
  comp = np.zeros((3, T), np.int32)
  env = np.zeros((3, T), np.float32)
  for b, parts in enumerate(texts):
    t = 0
    for i, part in enumerate(parts):
      ids = _ids(part)
      comp[b, t : t + len(ids)] = ids
      env[b, t : t + len(ids)] = part.startswith("<obs>")
      t += len(ids)
  prompts = np.full((3, 4), 5, np.int32)
  ro = rollout.Rollout(
    tokens=np.concatenate([prompts, comp], 1),
    prompt_mask=np.ones((3, 4), np.float32),
    completion_mask=((comp > 0) & (env == 0)).astype(np.float32),
    logprobs=np.zeros((3, T), np.float32),
    lengths=np.zeros(3, np.int32),
    truncated=np.zeros(3, bool),
    group=np.arange(3),
    policy_version=np.zeros(3, np.int32),
    env_mask=env,
  )
  np.testing.assert_array_equal(agents.call_counts(env), [2, 0, 1])
  np.testing.assert_array_equal(agents.error_counts(TOKENIZER, ro), [1, 0, 0])
  m = agents.metrics(TOKENIZER, ro)
  assert m["agent/tool_calls"] == pytest.approx(1.0)
  assert m["agent/call_rate"] == pytest.approx(2 / 3)
  assert m["agent/tool_errors"] == pytest.approx(1 / 3)
  assert m["agent/obs_tokens"] == pytest.approx(env.sum() / 3)
  real = np.asarray([0, 1, 1])
  assert agents.metrics(TOKENIZER, ro, real)["agent/call_rate"] == pytest.approx(0.5)
  assert agents.metrics(TOKENIZER, ro.replace(env_mask=None)) == {}


def _config(**agent):
  c = defaults.make_smoke(defaults.base_config())
  c.env.update(name="long_mult", level=2)
  c.agent = ml_collections.ConfigDict(agent)  # validate fills in the other keys
  return c


@pytest.mark.parametrize(
  "agent, message",
  [
    (dict(tools=("abacus",)), "abacus"),
    (dict(tools="calculator"), "tuple of tool names"),
    (dict(tools=("calculator",), max_obs_chars=4), "cut mark"),
    (dict(tools=("calculator",), max_turns=0), "agent.max_turns"),
    (dict(tools=("calculator",), tool_kwargs={"python": {"cpu_s": 1.0}}), "tool_kwargs"),
  ],
)
def test_bad_agent_configs_are_refused(agent, message):
  with pytest.raises(ConfigError, match=message):
    validate_config(_config(**agent))


def test_routing_replay_and_several_processes_are_refused():
  c = _config(tools=("calculator",))
  c.rl.routing_replay = True
  with pytest.raises(ConfigError, match="routing_replay"):
    validate_config(c)
  c = _config(tools=("calculator",))
  c.distributed.num_processes = 2
  with pytest.raises(ConfigError, match="one process"):
    validate_config(c)


def test_tool_options_reach_the_tool():
  a = _agent_cfg(tools=("python",), tool_kwargs={"python": {"cpu_s": 1.0, "wall_s": 2.0}})
  built = agents.build_tools(a)
  assert built["python"].timeout_s == a.tool_timeout_s
  assert tool_calls.TOOL_CLOSE not in built["python"]("print(6*7)").text
  assert built["python"]("print(6*7)").text.strip() == "42"


def test_extra_eval_envs_evaluate_their_own_problems(tmp_path):
  """config.eval.extra_envs: each gets held-out problems of its own env, at heldout_level."""
  from posttrain_jax.train import context as context_lib

  c = defaults.make_smoke(defaults.base_config())
  c.env.update(name="tom_shortcut", level=2)
  c.eval.update(extra_envs=("tom_order3", "tom_counterfactual"), heldout_level=1)
  validate_config(c)
  ctx = methods_lib.make_context(c, str(tmp_path))
  order3 = ctx.make_evaluator(extra="tom_order3")
  counterfactual = ctx.make_evaluator(extra="tom_counterfactual")
  assert {p.env for p in order3.problems} == {"tom_order3"}
  assert all(len(p.data[1]) == 3 for p in order3.problems)
  assert {p.env for p in counterfactual.problems} == {"tom_counterfactual"}
  assert all(p.level == 1 for p in counterfactual.problems)
  assert order3.pass_n == 0 and order3.prefix == "eval/extra_"
  # eval_sets (built without a model, for scripts/tom_shortcut.py) gives the very same problems
  sets = context_lib.eval_sets(c)
  assert sets["train"][1] == ctx.eval_problems and "heldout" not in sets
  assert sets["tom_order3"][1] == order3.problems
  assert sets["tom_counterfactual"][1] == counterfactual.problems
  assert sets["tom_order3"][1] != sets["tom_counterfactual"][1]
  c.eval.extra_envs = ("tom_order4",)
  with pytest.raises(ConfigError, match="eval.extra_envs"):
    validate_config(c)
