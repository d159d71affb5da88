"""The instruct env (the rubric reward's toy): its hidden ground truth against hand-written
responses, its fluency rule against hand-listed templates, its corpora's rates, its protocol
and its artefact writer."""

import jax
import numpy as np
import pytest

from posttrain_jax import envs
from posttrain_jax.envs import instruct
from posttrain_jax.rewards import rubric

ENV = envs.ENVS["instruct"]
P3 = ENV.make("cow", 3, 4, "red", "i")  # "cow;4-6;k=red;x=i:"


@pytest.mark.parametrize(
  "text,values",
  [
    # count, keyword, letter, topic, fluency
    ("my red cow ran", (1, 1, 1, 1, 1.0)),
    ("my red cow ran a farm", (1, 1, 1, 1, 1.0)),
    ("my red cow hid", (1, 1, 0, 1, 1.0)),  # 'i' in hid
    ("red my cow ran", (1, 1, 1, 1, 3 / 5)),  # START>ADJ, ADJ>DET broken
    ("my red fox ran", (1, 1, 1, 0, 1.0)),  # off topic
    ("my old cow ran", (1, 0, 1, 1, 1.0)),  # no keyword
    ("my big cow ran", (1, 0, 0, 1, 1.0)),  # no keyword, 'i' in big
    ("the red cow", (0, 1, 1, 1, 1.0)),  # 3 words
    ("my red cow ran a wet calm farm", (0, 1, 1, 1, 1.0)),  # 8 words
    ("my red cow zzz", (1, 1, 1, 1, 3 / 5)),  # an unknown word breaks two edges
    ("my  red cow ran", (1, 1, 1, 1, 4 / 6)),  # a double space: an empty word
    ("", (0, 0, 0, 0, 0.0)),
  ],
)
def test_ground_truth_hand_written(text, values):
  got = ENV.requirements(P3, text)
  assert tuple(got) == ("count", "keyword", "letter", "topic", "fluency")
  assert tuple(got.values()) == pytest.approx(values)
  assert ENV.score(P3, text) == pytest.approx(sum(values) / 5)
  assert ENV.verify(P3, text) == float(all(v == 1 for v in values))
  assert ENV.verify(P3, " " + text + " ") == ENV.verify(P3, text)


def test_levels_carry_their_constraints():
  p0, p1, p2 = (ENV.make("cow", lvl, 4, "red", "i") for lvl in (0, 1, 2))
  assert (p0.prompt, p1.prompt, p2.prompt, P3.prompt) == (
    "cow:",
    "cow;4-6:",
    "cow;4-6;k=red:",
    "cow;4-6;k=red;x=i:",
  )
  assert list(ENV.requirements(p0, "my cow")) == ["topic", "fluency"]
  assert ENV.verify(p0, "my cow") == 1.0 and ENV.verify(p1, "my cow") == 0.0  # 2 < 4 words
  assert ENV.verify(p2, "my big cow hid") == 0.0 and ENV.verify(p1, "my big cow hid") == 1.0
  with pytest.raises(ValueError, match="letter"):
    ENV.make("cow", 3, 4, "red", "e")  # the letter is in the keyword: no correct answer
  assert ENV.verify(P3, None) == 0.0 and ENV.verify(P3, 3) == 0.0


def test_fluency_templates_hand_listed():
  assert instruct.templates(2) == (("DET", "NOUN"),)
  assert set(instruct.templates(3)) == {("DET", "NOUN", "VERB"), ("DET", "ADJ", "NOUN")}
  assert set(instruct.templates(4)) == {
    ("DET", "ADJ", "NOUN", "VERB"),
    ("DET", "ADJ", "ADJ", "NOUN"),
  }
  assert instruct.fluency(["the", "cow"]) == 1.0
  assert instruct.fluency(["cow", "the"]) == 0.0  # START>NOUN, NOUN>DET, DET>END
  assert instruct.fluency([]) == 0.0


@pytest.mark.parametrize("level", instruct.LEVELS)
def test_protocol(level):
  seen = set()
  for split in envs.SPLITS if level else ("train",):  # level 0 has 5 prompts, none held out
    for p in ENV.sample(jax.random.key(level), 150, level=level, split=split):
      assert ENV.verify(p, p.answer) == 1.0, p
      assert len(p.prompt) <= ENV.max_prompt_chars(level)
      assert len(p.answer) <= ENV.max_answer_chars(level)
      assert set(p.prompt + p.answer) <= set(ENV.chars)
      assert envs.split_of(p.uid, ENV.eval_percent) == split
      assert ENV.rebuild(p) == p
      assert ENV.rebuild(envs.Problem(p.prompt, "", "instruct", level, p.uid)) == p
      seen.add((split, p.uid))
  train = {u for s, u in seen if s == "train"}
  assert train and not train & {u for s, u in seen if s == "eval"}


def test_compose_keeps_or_breaks_each_requirement():
  rng = np.random.default_rng(0)
  problems = ENV.sample(jax.random.key(3), 60, level=3)
  for p in problems:
    for flags in ((1, 1, 1, 1), (0, 1, 1, 1), (1, 0, 1, 1), (1, 1, 0, 1), (1, 1, 1, 0)):
      kw = dict(zip(("count", "keyword", "letter", "topic"), map(bool, flags)))
      text = ENV.compose(p, rng, **kw)
      got = ENV.requirements(p, text)
      assert got["fluency"] == 1.0, text
      for name, keep in kw.items():
        if name == "letter" and not keep and got[name] == 1.0:
          continue  # no slot could take the letter: kept by chance
        assert got[name] == float(keep), (p.prompt, text, name)


def test_corpus_rates():
  n = 1500
  problems = {p.prompt: p for p in ENV.sample(jax.random.key(5), n, level=3, split="train")}
  clean = ENV.corpus(jax.random.key(5), n, level=3, noise=0.0)
  noisy = ENV.corpus(jax.random.key(5), n, level=3, noise=1.0)
  req = [ENV.requirements(problems[q], a) for q, a in clean]
  assert all(r["fluency"] == 1.0 and r["topic"] == 1.0 for r in req)
  for name in instruct.HARD:  # kept with probability HONOR (the letter a little more: chance)
    rate = np.mean([r[name] for r in req])
    assert instruct.HONOR - 0.05 < rate < instruct.HONOR + (0.15 if name == "letter" else 0.05)
  bad = [ENV.requirements(problems[q], a) for q, a in noisy]
  assert all(r["fluency"] < 1.0 or r["topic"] == 0.0 for r in bad)
  assert 0.4 < np.mean([r["topic"] == 0.0 for r in bad]) < 0.6
  with pytest.raises(ValueError, match="noise"):
    ENV.corpus(jax.random.key(0), 2, level=3, noise=1.5)


def test_artefact_writer():
  art = rubric.WRITERS["instruct"](P3.prompt)
  assert [c.name for c in art.checkers] == ["count", "keyword", "letter"]
  assert [(i.judge, i.weight) for i in art.items] == [
    ("mentions", 2.0),
    ("uses", 1.0),
    ("length", 1.0),
    ("mentions", 1.0),
  ]
  assert art.items[0].args == ("cow",) and art.items[3].args == ("red",)
  for c in art.checkers:  # each a pure function of the response
    ns = {}
    exec(c.source, ns)  # pylint: disable=exec-used
    assert ns["check"]("my red cow ran") is True
  level0 = rubric.WRITERS["instruct"]("cow:")
  assert level0.checkers == () and [i.judge for i in level0.items] == ["mentions", "uses"]
  with pytest.raises(ValueError, match="not an instruct prompt"):
    rubric.WRITERS["instruct"]("12+3=")


def test_constraints_only_variant():
  env = envs.ENVS["instruct_constraints"]
  p = env.make("cow", 3, 4, "red", "i")
  assert p.prompt == P3.prompt and p.answer == P3.answer and p.env == "instruct_constraints"
  assert env.verify(p, "red ran my dog") == 1.0 and ENV.verify(P3, "red ran my dog") == 0.0
  assert env.verify(p, "my red cow hid") == 0.0  # the letter
  assert env.verify(p, "my old cow ran") == 0.0  # the keyword
  assert env.verify(env.make("cow", 0), "zz") == 1.0  # level 0: no hard constraint
  held = [q.uid for q in env.sample(jax.random.key(2), 20, level=3, split="eval")]
  assert all(envs.split_of(u, ENV.eval_percent) == "eval" for u in held)
