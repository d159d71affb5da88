"""envs/tom.py: false-belief stories, their nested answers against a brute-force simulator, the
shortcut and counterbalanced splits, held-out orders, counterfactual edits and the audit's
ablations (methods_A.md section 1 (d))."""

import itertools

import jax
import numpy as np
import pytest

from posttrain_jax import envs
from posttrain_jax.envs import tom

TOM = envs.ENVS["tom"]


def _replay(story: tom.Story, chain: str) -> int:
  """A third reading, by simulation step by step: each agent of the story keeps its own view of
  the world as a list of the moves it saw; a chain's belief is the last move in the first
  agent's view that every later agent of the chain was also present for."""
  present = set(story.agents)
  log = [(set(present), story.start)]
  for agent, kind, to in story.events:
    if kind == "+":
      present.add(agent)
    elif kind == "-":
      present.remove(agent)
    else:
      log.append((set(present), to))
  views = {a: [box for who, box in log if a in who] for a in story.agents}
  if not chain:
    return log[-1][1]
  joint = [box for who, box in log if set(chain) <= who]
  assert joint[-1] in views[chain[0]]
  return joint[-1]


def test_sally_anne():
  # A and B see the ball in box 1; B leaves; A moves it to 2; B comes back.
  story = tom.parse_story("AB;o1;B-;A2;B+")
  assert tom.believe(story, "") == 2  # where it is
  assert tom.believe(story, "A") == 2  # A saw the move
  assert tom.believe(story, "B") == 1  # B did not: a false belief
  assert tom.believe(story, "AB") == 1  # A knows B did not see it
  assert tom.believe(story, "BA") == 1  # B saw nothing of the move: thinks A thinks 1
  p = TOM.make(story, "B", 2)
  assert p.prompt == "AB;o1;B-;A2;B+;?B=" and p.answer == "1"
  assert TOM.trace(p) == "1#1" and TOM.trace(TOM.make(story, "A", 2)) == "12#2"


def test_generator_agrees_with_brute_force_on_every_chain():
  rng = np.random.default_rng(0)
  for _ in range(400):
    story = TOM._story(rng)
    chains = [""] + [
      "".join(c) for k in (1, 2, 3) for c in itertools.product(story.agents, repeat=k)
    ]
    tracked = tom.track(story, chains)
    for chain in chains:
      assert tracked[chain] == tom.believe(story, chain) == _replay(story, chain), (story, chain)
    assert tom.parse_story(story.text()) == story


@pytest.mark.parametrize("name", ["tom", "tom_shortcut", "tom_order3", "tom_counterfactual"])
def test_answers_traces_and_rebuild(name):
  env = envs.ENVS[name]
  for p in env.sample(jax.random.key(1), 200, level=2):
    story, chain = p.data
    assert p.answer == str(tom.believe(story, chain))
    assert env.verify(p, p.answer) == 1.0 and env.verify(p, env.trace(p)) == 1.0
    assert env.rebuild(p) == p
    if name == "tom_order3":
      assert len(chain) == 3
    else:
      assert len(chain) <= 2


def test_the_shortcut_is_right_95_percent_on_its_split_and_at_chance_counterbalanced():
  n = 2000
  for name, rate in (("tom_shortcut", 0.95), ("tom", 0.25), ("tom_order3", 0.25)):
    problems = envs.ENVS[name].sample(jax.random.key(2), n, level=2)
    hits = np.mean([tom.last_mentioned(p.prompt) == p.answer for p in problems])
    sigma = np.sqrt(rate * (1 - rate) / n)
    assert abs(hits - rate) < 2 * sigma + 1e-9 or abs(hits - rate) < 0.02, (name, hits)
  # On the counterbalanced split the shortcut scores chance among the four boxes (1/4), and
  # answers are spread over the boxes.
  answers = [p.answer for p in TOM.sample(jax.random.key(3), n, level=2)]
  counts = np.asarray([answers.count(b) for b in tom.BOXES]) / n
  assert np.all(np.abs(counts - 0.25) < 0.05), counts


def test_counterfactual_edits_change_the_answer():
  env = envs.ENVS["tom_counterfactual"]
  rng = np.random.default_rng(4)
  for _ in range(100):
    story = TOM._story(rng)
    p = env._counterfactual(rng, story, 2)
    if p is None:
      continue
    edited, chain = p.data
    assert len(edited.events) == len(story.events) - 1
    assert tom.believe(edited, chain) != tom.believe(story, chain)
    assert tom._valid(edited)


def test_ablations_and_the_last_mention_probe():
  prompt = "AB;o1;B-;A2;B+;?B="
  assert tom.last_mentioned(prompt) == "2"
  assert tom.ablate(prompt, "question") == "?B="
  assert tom.ablate(prompt, "no_presence") == "AB;o1;A2;?B="
  assert tom.ablate(prompt, "final_state") == "AB;o2;?B="
  with pytest.raises(ValueError, match="unknown ablation"):
    tom.ablate(prompt, "story_only")


def test_corpus_and_malformed_text():
  pairs = TOM.corpus(jax.random.key(5), 300, level=2, noise=0.0, thinking=True)
  probs = TOM.sample(jax.random.key(5), 300, level=2)
  assert all(TOM.verify(p, y) == 1.0 and "#" in y for p, (_, y) in zip(probs, pairs))
  noisy = TOM.corpus(jax.random.key(5), 300, level=2, noise=1.0)
  assert all(y == tom.last_mentioned(x) for x, y in noisy)
  p = probs[0]
  for bad in ("", "#", "12#", None, "1#2#"):
    assert TOM.verify(p, bad) == float(bad is not None and bad.rpartition("#")[2] == p.answer)
  for bad in ("AB;o5;A2", "AB;x1;A2", "AB;o1;C2", "AB;o1;A9", "o1;A2", "A"):
    with pytest.raises(ValueError, match="not a tom"):
      tom.parse_story(bad)


@pytest.mark.parametrize("split", ["tom", "tom_shortcut"])
def test_ablated_envs_keep_the_problems_and_answers_and_show_the_ablated_input(split):
  full = envs.ENVS[split].sample(jax.random.key(6), 100, level=2)
  for ablation in tom.ABLATIONS:
    ablated = envs.ENVS[f"{split}/{ablation}"].sample(jax.random.key(6), 100, level=2)
    assert [p.uid for p in ablated] == [p.uid for p in full]
    assert [p.answer for p in ablated] == [p.answer for p in full]
    assert all(a.prompt == tom.ablate(f.prompt, ablation) for a, f in zip(ablated, full))
    assert envs.ENVS[f"{split}/{ablation}"].rebuild(ablated[0]) == ablated[0]
  # The final-state input answers the shortcut split's questions about as often as the
  # shortcut is right (95%), the counterbalanced split's at chance.
  final = [
    tom.last_mentioned(p.prompt) == p.answer
    for p in envs.ENVS[f"{split}/final_state"].sample(jax.random.key(7), 1000, level=2)
  ]
  assert abs(np.mean(final) - envs.ENVS[split].shortcut_rate()) < 0.04


def test_thinking_envs_train_on_traces():
  think = envs.ENVS["tom_shortcut_think"]
  pairs = think.corpus(jax.random.key(8), 50, level=2)
  problems = think.sample(jax.random.key(8), 50, level=2)
  assert all(y == think.trace(p) for p, (_, y) in zip(problems, pairs))
  assert all(
    "#" not in y for _, y in envs.ENVS["tom_shortcut"].corpus(jax.random.key(8), 50, level=2)
  )
