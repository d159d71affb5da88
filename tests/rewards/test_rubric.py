"""The rubric reward (methods_B.md section 13): s_R and s_C against hand-computed values, the
checkers in one sandbox run per batch (deterministic, side-effect free, cut when they hang),
the artefact cache, the hybrid's weights and gate, and its ranking of hand-made responses."""

import io
import json
import os

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain_jax import envs
from posttrain_jax.registry import ConfigError
from posttrain_jax.rewards import REWARDS, RewardSet, RunInfo, Scorer, rubric, sandbox

ENV = envs.ENVS["instruct"]
P3 = ENV.make("cow", 3, 4, "red", "i")  # "cow;4-6;k=red;x=i:"
ART = rubric.WRITERS["instruct"](P3.prompt)


class FakeScorer:
  """A global scorer LM stand-in: mean log-likelihood log(0.1 + 0.9 * fluency * topic) (the
  real LM is loaded and run by the experiment's smoke test)."""

  def __init__(self):
    self.calls = 0

  def score(self, prompts, texts):
    self.calls += 1
    out = []
    for prompt, text in zip(prompts, texts):
      topic = instruct_topic(prompt)
      words = text.strip().split(" ")
      good = envs.instruct.fluency(words) * float(topic in words)
      out.append(np.log(0.1 + 0.9 * good))
    return np.asarray(out, np.float32)


def instruct_topic(prompt):
  return envs.instruct.parse_prompt(prompt)["topic"]


def _run(tmp_path, scorer=None) -> RunInfo:
  run = RunInfo(workdir=str(tmp_path))
  run.cache[("rubric_scorer", os.path.abspath(os.path.join(str(tmp_path), "teacher")))] = (
    scorer or FakeScorer()
  )
  return run


# -- s_R and s_C by hand ----------------------------------------------------------------------
@pytest.mark.parametrize(
  "text,s_r,s_c",
  [
    # items: topic (w 2), two lexicon words (1), 4-6 words (1, soft), keyword (1)
    ("my red cow ran", (2 + 0.5 + 1 + 1) / 5, 1.0),
    ("my red cow ran a farm", 1.0, 1.0),
    ("my red cow hid", (2 + 0.5 + 1 + 1) / 5, 2 / 3),  # 'i': the letter checker fails
    ("my old dog ran", 1 / 5, 2 / 3),  # only the length; no keyword
    ("a cow", (2 + 0.5 + (1 - 2 / 4) + 0) / 5, 1 / 3),  # 2 words: length 1 - 2/lo
    ("the big dog", (0 + 0 + (1 - 1 / 4) + 0) / 5, 0.0),  # 'i' in big, 3 words, no keyword
  ],
)
def test_scores_hand_computed(text, s_r, s_c):
  assert rubric.rubric_score(text, ART) == pytest.approx(s_r)
  report = rubric.checker_scores([text], [ART])
  assert report.scores()[0] == pytest.approx(s_c)
  assert report.reasons == ((),)  # a failed constraint is a verdict, not an error


def test_no_checkers_and_no_rubric():
  empty = rubric.Artefact("x")
  level0 = rubric.WRITERS["instruct"]("cow:")
  report = rubric.checker_scores(["anything", "my cow"], [empty, level0])
  assert report.result is None  # M = 0 everywhere: no sandbox run at all
  assert list(report.scores()) == [1.0, 1.0]
  assert rubric.rubric_score("anything", empty) == 1.0
  mixed = rubric.checker_scores(["my cow", "my red cow ran"], [level0, ART])
  assert list(mixed.scores()) == [1.0, 1.0] and mixed.result.ok


def test_non_text_fails_every_checker():
  report = rubric.checker_scores([None, "my red cow ran"], [ART, ART])
  assert list(report.scores()) == [0.0, 1.0]
  assert report.reasons[0] == tuple((c.name, "not text") for c in ART.checkers)


# -- the checkers in the sandbox --------------------------------------------------------------
def _art(*sources) -> rubric.Artefact:
  return rubric.Artefact("p", (), tuple(rubric.Checker(f"c{i}", s) for i, s in enumerate(sources)))


OK = "def check(response):\n  return len(response) > 2\n"


def test_bad_checkers_score_zero_with_a_reason():
  art = _art(
    "def check(response):\n  while True:\n    pass\n",
    "def check(response):\n  return 1 / 0\n",
    "def check(response):\n  return 1\n",
    "def check(response:\n",
    OK,
  )
  report = rubric.checker_scores(["abcd", "xy"], [art, art], check_s=0.2)
  assert report.passed == ((False, False, False, False, True), (False, False, False, False, False))
  why = dict(report.reasons[0])
  assert why["c0"].startswith("TimeoutError") and "time limit" in why["c0"]
  assert why["c1"].startswith("ZeroDivisionError")
  assert why["c2"] == "TypeError: returned a int, not a bool"
  assert why["c3"].startswith("SyntaxError")
  assert "c4" not in why and "c4" not in dict(report.reasons[1])  # False is a verdict
  assert report.scores() == pytest.approx([0.2, 0.0])
  assert report.result.ok  # the loops were cut per call; the run itself ended normally


def test_checkers_are_deterministic_and_side_effect_free():
  stateful = "COUNT = []\ndef check(response):\n  COUNT.append(1)\n  return len(COUNT) == 1\n"
  files = (
    "import os\n"
    "def check(response):\n  if os.listdir('.'):\n    return False\n"
    "  open('mark', 'w').write(response)\n  return True\n"
  )
  env_var = "import os\ndef check(response):\n  return 'HOME' in os.environ\n"
  art = _art(stateful, files, env_var)
  rows = [f"row {i}" for i in range(6)]
  first = rubric.checker_scores(rows, [art] * 6)
  second = rubric.checker_scores(rows, [art] * 6)
  assert first.passed == second.passed == ((True, True, True),) * 6
  assert first.result.isolation == sandbox.isolation()


def test_one_sandbox_run_per_batch(monkeypatch):
  calls = []
  real = sandbox.run
  monkeypatch.setattr(sandbox, "run", lambda *a, **k: calls.append(1) or real(*a, **k))
  problems = ENV.sample(jax.random.key(0), 16, level=3)
  arts = [rubric.WRITERS["instruct"](p.prompt) for p in problems]
  report = rubric.checker_scores([p.answer for p in problems], arts)
  assert len(calls) == 1 and list(report.scores()) == [1.0] * 16


# -- the artefact cache -----------------------------------------------------------------------
def test_artefacts_are_written_once_and_reused(tmp_path, monkeypatch):
  written = []

  def writer(prompt):
    written.append(prompt)
    return rubric.WRITERS["instruct"](prompt)

  monkeypatch.setitem(rubric.WRITERS, "counting", writer)
  problems = ENV.sample(jax.random.key(1), 4, level=3)
  batch = [p for p in problems for _ in range(4)]  # a group of 4 rollouts per prompt
  run = _run(tmp_path)
  for step in range(3):  # three steps, new completions each
    texts = [ENV.compose(p, np.random.default_rng(step * 100 + i)) for i, p in enumerate(batch)]
    rubric.components(batch, texts, run, writer="counting", need_global=False)
  assert sorted(written) == sorted({p.prompt for p in problems})
  key = rubric.prompt_key(problems[0].prompt)
  path = tmp_path / "rubric" / "artefacts" / "counting" / f"{key}.json"
  assert json.loads(path.read_text())["prompt"] == problems[0].prompt
  again = RunInfo(workdir=str(tmp_path))  # a resumed run: read from disk, not rewritten
  assert rubric.artefact(problems[0].prompt, again, "counting") == rubric.WRITERS["instruct"](
    problems[0].prompt
  )
  assert len(written) == len({p.prompt for p in problems})


def test_a_users_writer_by_file(tmp_path):
  path = tmp_path / "my_writer.py"
  path.write_text(
    "from posttrain_jax.rewards import rubric\n"
    "def write(prompt):\n"
    "  return rubric.Artefact(prompt, (rubric.RubricItem('long', 1.0, 'length', "
    "(5, 9)),), (rubric.Checker('has_x', 'def check(r):\\n  return \"x\" in r\\n'),"
    "))\n"
  )
  run = RunInfo(workdir=str(tmp_path / "run"))
  v = rubric.components(
    [P3, P3], ["x y z w v", "a"], run, writer=f"{path}:write", need_global=False
  )
  assert list(v["s_C"]) == [1.0, 0.0] and list(v["s_R"]) == pytest.approx([1.0, 1 - 4 / 5])
  with pytest.raises(ConfigError, match="unknown artefact writer 'nope'; valid writers: "):
    rubric.components([P3], ["a"], RunInfo(), writer="nope", need_global=False)
  bad = tmp_path / "bad_writer.py"
  bad.write_text("def write(prompt):\n  return {'items': []}\n")
  with pytest.raises(ConfigError, match="returned a dict, not a rubric.Artefact"):
    rubric.components([P3], ["a"], RunInfo(), writer=f"{bad}:write", need_global=False)


# -- the hybrid -------------------------------------------------------------------------------
def test_hybrid_hand_computed_and_gate():
  assert rubric.hybrid(0.9, 0.5, 2 / 3) == pytest.approx((0.9 + 0.5 + 2 / 3) / 3)
  assert rubric.hybrid(0.9, 0.5, 2 / 3, 2, 1, 1) == pytest.approx((1.8 + 0.5 + 2 / 3) / 4)
  assert list(rubric.hybrid([0.9, 0.9], [0.5, 0.5], [2 / 3, 1.0], gate=True)) == pytest.approx(
    [0.0, (0.9 + 0.5 + 1) / 3]
  )
  for bad, match in (
    ({"a": -1}, "kwargs.a must be a finite number >= 0"),
    ({"a": 0, "b": 0, "c": 0}, "all 0"),
    ({"c": float("nan")}, "kwargs.c must be"),
  ):
    with pytest.raises(ConfigError, match=match):
      rubric.hybrid(0.5, 0.5, 0.5, **bad)


@settings(max_examples=100, deadline=None)
@given(
  s=st.lists(st.tuples(*[st.floats(0, 1)] * 3), min_size=1, max_size=8),
  w=st.tuples(*[st.floats(0, 10)] * 3).filter(lambda w: sum(w) > 1e-3),
  k=st.floats(0.01, 100),
  gate=st.booleans(),
)
def test_hybrid_range_and_normalisation(s, w, k, gate):
  s_r, s_g, s_c = (np.asarray(x) for x in zip(*s))
  r = rubric.hybrid(s_r, s_g, s_c, *w, gate=gate)
  assert np.all((r >= 0) & (r <= 1 + 1e-12))
  assert rubric.hybrid(s_r, s_g, s_c, *(k * x for x in w), gate=gate) == pytest.approx(r)
  # a = 0 removes s_R: any other s_R gives the same reward
  assert rubric.hybrid(1 - s_r, s_g, s_c, 0, w[1] + 1, w[2], gate=gate) == pytest.approx(
    rubric.hybrid(s_r, s_g, s_c, 0, w[1] + 1, w[2], gate=gate)
  )


def test_the_terms_through_a_reward_set(tmp_path):
  scorer = FakeScorer()
  run = _run(tmp_path, scorer)
  texts = ["my red cow ran a farm", "my red cow hid", "red ran my dog"]
  terms = {
    "correct": {"weight": 0.0},
    "rubric": {"kwargs": {"a": 1, "b": 1, "c": 1}},
    "rubric_sR": {"weight": 0.0},
    "rubric_sC": {"weight": 0.0},
    "rubric_sG": {"weight": 0.0},
  }
  rs = RewardSet.from_config(terms, run)
  assert all(t.batched for t in rs.terms[1:])
  scorer_pool = Scorer(timeout=5.0, workers=0, max_error_rate=1.0, out=io.StringIO())
  total, codes, comps, errs = rs.score(scorer_pool, ENV, [P3] * 3, texts, env="instruct")
  assert comps["rubric_sC"] == pytest.approx([1.0, 2 / 3, 1.0])
  assert comps["rubric_sR"] == pytest.approx([1.0, 0.9, 0.4])
  assert comps["rubric_sG"] == pytest.approx([1.0, 1.0, 0.1])
  assert total == pytest.approx(
    (comps["rubric_sR"] + comps["rubric_sG"] + comps["rubric_sC"]) / 3, abs=1e-6
  )
  assert comps["correct"] == pytest.approx([1.0, 0.0, 0.0]) and not codes.any()
  assert not any(e.any() for e in errs.values())
  assert scorer.calls == 1  # the batch's components were computed once for all four terms
  metrics = rs.metrics(comps, errs)
  assert metrics["reward/rubric_sC"] == pytest.approx((2 + 2 / 3) / 3)
  with pytest.raises(ConfigError, match="kwargs.a must be a finite number >= 0"):
    REWARDS["rubric"]([P3], ["a"], run=run, a=-1.0)


def test_no_scorer_is_needed_without_b(tmp_path):
  run = RunInfo(workdir=str(tmp_path))  # no teacher stage, no scorer in the cache
  r = REWARDS["rubric"]([P3], ["my red cow ran a farm"], run=run, a=1, b=0, c=1)
  assert list(r) == [1.0]
  with pytest.raises(ConfigError, match="found no trained model at .*run the 'teacher' stage"):
    REWARDS["rubric"]([P3], ["my red cow ran a farm"], run=run)


def test_hybrid_ranks_the_correct_response_above_each_ablations_failure(tmp_path):
  """A fully correct response against what each single component cannot see: code_only's
  failure (constraints kept, off topic and disfluent), rubric_only's (topic, lexicon, length
  and keyword right, the forbidden letter used and disfluent) and global_only's (fluent and
  on topic, the constraints broken)."""
  run = _run(tmp_path)
  correct = "my red cow ran a farm"
  failures = {
    "code_only": "red ran my dog a",
    "rubric_only": "cow milk red farm calf",
    "global_only": "a big cow hid",
  }
  texts = [correct] + list(failures.values())
  assert [ENV.verify(P3, t) for t in texts] == [1.0, 0.0, 0.0, 0.0]
  v = rubric.components([P3] * 4, texts, run)
  single = {"code_only": v["s_C"], "rubric_only": v["s_R"], "global_only": v["s_G"]}
  for i, arm in enumerate(failures, start=1):
    assert single[arm][i] >= single[arm][0] - 0.2, (arm, single[arm])  # the arm is fooled
  r = rubric.hybrid(v["s_R"], v["s_G"], v["s_C"])
  assert all(r[0] > r[i] + 0.2 for i in (1, 2, 3)), r


def test_global_score_of_a_saved_teacher_stage(tmp_path):
  """s_G from a run's ``teacher/final`` (a random nano model, the teacher's preset from the
  run's config.json) against exp of the mean log-softmax read token by token here."""
  from flax import nnx

  from posttrain_jax import io as ptio
  from posttrain_jax import models

  tok = models.build_char_tokenizer(ENV.chars)
  config = models.preset("nano", vocab_size=len(tok), max_seq_len=64)
  graphdef, params = models.init_decoder(config, 3)
  ckpt = ptio.Checkpointer(str(tmp_path / "teacher" / "final"), max_to_keep=1)
  ckpt.save(0, params, {"stage": "teacher"})
  ckpt.close()
  (tmp_path / "config.json").write_text(
    json.dumps(
      {
        "model": {"preset": "tiny", "max_seq_len": 64, "dtype": "float32", "overrides": {}},
        "rl": {"teacher": {"preset": "nano", "overrides": {}}},
      }
    )
  )
  run = RunInfo(workdir=str(tmp_path), tokenizer=tok)
  texts = ["my red cow ran a farm", "zz", ""]
  got = rubric.global_scores([P3.prompt] * 3, texts, run)
  p_ids = tok(P3.prompt, add_special_tokens=False)["input_ids"]
  rows = [p_ids + tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
  padded = np.zeros((len(rows), max(map(len, rows))), np.int32)  # causal: padding after is inert
  for i, ids in enumerate(rows):
    padded[i, : len(ids)] = ids
  logits = np.asarray(nnx.merge(graphdef, params)(padded).logits, np.float64)
  for i, (ids, g) in enumerate(zip(rows, got)):
    logp = [
      logits[i, t - 1, ids[t]] - np.log(np.exp(logits[i, t - 1]).sum())
      for t in range(len(p_ids), len(ids))
    ]
    assert g == pytest.approx(np.exp(np.mean(logp)), rel=1e-4)
  assert 0 < got.min() and got.max() <= 1
  assert len([k for k in run.cache if k[0] == "rubric_scorer"]) == 1  # loaded once
  rubric.global_scores([P3.prompt], ["a"], run)
  assert len([k for k in run.cache if k[0] == "rubric_scorer"]) == 1
