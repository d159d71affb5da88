"""Sally-Anne style false-belief stories with nested belief questions: the ToM toy of
methods_A.md section 1 (issue 24), with a shortcut split, a counterbalanced split, held-out
third-order questions and counterfactual edits.

A story is a ball, four boxes and agents ``A``-``D``, all in the room when the ball is put in
its first box. Prompt ``AB;o2;A3;B-;A1;B+;?B=``: A and B are in the room, the ball starts in box 2, ``A3`` A moves it to box
3, ``B-`` B leaves, ``A1`` A moves it to box 1, ``B+`` B comes back; ``?B=`` asks where B thinks
the ball is (3: B did not see the second move; the boxes are closed, so coming back shows
nothing). Events are ``X+`` (enters), ``X-`` (leaves), ``Xk`` (X, who is in the room, moves the
ball to box ``k``). A question names a chain of agents (empty: where the ball really is; one
agent: a first-order belief; ``?BA=``: where B thinks A thinks it is, second order; ...).

Who sees what: an agent sees a move iff it is in the room then. ``X``'s belief is the box of the
last move ``X`` saw (the first box if none); ``X``'s belief about ``Y``'s belief is read from
the moves ``X`` saw ``Y`` see: those both were in the room for (the standard recursive reading:
:func:`believe`, a brute-force filter of the story, against which tests check the generator's
incremental state tracking, :func:`track`).

Answers: the box digit, or with a reasoning trace (Thinking-RFT's scratchpad, :meth:`ToM.trace`)
the boxes of the moves the chain saw, then ``#`` and the answer: ``23#3``. ``verify`` reads the
text after the last ``#`` (the whole text without one).

Splits of the same generator (``ENVS`` names): ``tom`` counterbalanced (the last box mentioned
in the story is the answer no more often than any other box: a last-mention shortcut scores
chance), ``tom_shortcut`` (the answer is the last box mentioned 95% of the time), ``tom_order3``
(third-order questions only: held out by order) and ``tom_counterfactual`` (a story with one
event edited so that the answer changes). Level ``L`` (1 to 3): questions of order 0 to ``L``.
"""

import dataclasses

import jax
import numpy as np

from posttrain_jax.envs import base

AGENTS = "ABCD"
BOXES = "1234"
SEP, QUESTION, ANSWER = ";", "?", "#"
CHARS = AGENTS + BOXES + "o+-;?=#"
LEVELS = (1, 2, 3)
MIN_EVENTS, MAX_EVENTS = 4, 8


@dataclasses.dataclass(frozen=True)
class Story:
  """``start``: the ball's first box; ``agents``: who is in the story (all in the room at the
  start); ``events``: ``(agent, kind, box)`` with kind ``+``, ``-`` or ``m`` (a move to ``box``)."""

  start: int
  agents: str
  events: tuple

  def text(self) -> str:
    parts = [self.agents, f"o{self.start}"]
    for agent, kind, box in self.events:
      parts.append(f"{agent}{box}" if kind == "m" else f"{agent}{kind}")
    return SEP.join(parts)


def parse_story(text: str) -> Story:
  """The :class:`Story` of its text (the prompt before ``;?``)."""
  parts = text.split(SEP)
  if (
    len(parts) < 2
    or not parts[0]
    or any(a not in AGENTS for a in parts[0])
    or len(parts[1]) != 2
    or parts[1][0] != "o"
    or parts[1][1] not in BOXES
  ):
    raise ValueError(f"not a tom story: {text!r}")
  events = []
  for p in parts[2:]:
    if len(p) != 2 or p[0] not in parts[0] or not (p[1] in "+-" or p[1] in BOXES):
      raise ValueError(f"not a tom event: {p!r} in {text!r}")
    events.append((p[0], p[1] if p[1] in "+-" else "m", int(p[1]) if p[1] in BOXES else 0))
  return Story(int(parts[1][1]), parts[0], tuple(events))


def witnessed(story: Story) -> list[tuple[set, int]]:
  """The placing of the ball and each move: (the agents in the room, who see it; its box)."""
  present = set(story.agents)
  out = [(set(present), story.start)]
  for agent, kind, to in story.events:
    if kind == "+":
      present.add(agent)
    elif kind == "-":
      present.discard(agent)
    else:
      out.append((set(present), to))
  return out


def believe(story: Story, chain: str) -> int:
  """The brute-force answer: the last box among the moves every agent of ``chain`` saw, by
  filtering the story once per agent (``chain`` '': where the ball really is)."""
  seen = witnessed(story)
  for agent in chain:
    seen = [(who, box) for who, box in seen if agent in who]
  return seen[-1][1]


def track(story: Story, chains) -> dict[str, int]:
  """The generator's incremental state tracking: each chain's belief (agents outermost
  first), set at every move all its agents are in the room for. Tests check it against
  :func:`believe`."""
  beliefs = {c: story.start for c in chains}
  present = set(story.agents)
  for agent, kind, to in story.events:
    if kind == "+":
      present.add(agent)
    elif kind == "-":
      present.discard(agent)
    else:
      for c in chains:
        if set(c) <= present:
          beliefs[c] = to
  return beliefs


def last_mentioned(prompt: str) -> str:
  """The shortcut: the last box digit in the story (the probe the audit compares against)."""
  story = prompt.partition(SEP + QUESTION)[0]
  digits = [c for c in story if c in BOXES]
  return digits[-1] if digits else ""


def ablate(prompt: str, kind: str) -> str:
  """The audit's ablated inputs φ(x): ``question`` (the question alone), ``no_presence`` (the
  story without its enter/leave events: no mental-state evidence), ``final_state`` (only the
  ball's last box and the question)."""
  story, _, question = prompt.partition(SEP + QUESTION)
  question = QUESTION + question
  parts = story.split(SEP)
  if kind == "question":
    return question
  if kind == "no_presence":
    return SEP.join(parts[:2] + [p for p in parts[2:] if p[1] not in "+-"]) + SEP + question
  if kind == "final_state":
    return f"{parts[0]}{SEP}o{believe(parse_story(story), '')}" + SEP + question
  raise ValueError(f"unknown ablation {kind!r}; ablations: question, no_presence, final_state")


ABLATIONS = ("question", "no_presence", "final_state")


class ToM(base.GeneratedEnv):
  """Nested false-belief questions on generated stories (module docstring)."""

  chars = CHARS
  levels = LEVELS
  numeric_answers = True

  def __init__(
    self,
    name: str = "tom",
    split_kind: str = "counterbalanced",
    eval_percent: int = 10,
    *,
    thinking: bool = False,
    ablation: str = "",
  ):
    """``thinking``: the corpus's answers are reasoning transcripts (:meth:`trace`);
    ``ablation``: prompts are the audit's ablated input (:func:`ablate`), answers unchanged."""
    if split_kind not in ("counterbalanced", "shortcut", "order3", "counterfactual"):
      raise ValueError(f"unknown tom split kind {split_kind!r}")
    if ablation and ablation not in ABLATIONS:
      raise ValueError(f"unknown ablation {ablation!r}; ablations: {', '.join(ABLATIONS)}")
    self.name, self.split_kind, self.eval_percent = name, split_kind, eval_percent
    self.thinking, self.ablation = thinking, ablation

  def max_prompt_chars(self, level: int) -> int:
    return 3 * (MAX_EVENTS + 2) + 9

  def max_answer_chars(self, level: int) -> int:
    return MAX_EVENTS + 3

  def _story(self, rng: np.random.Generator) -> Story:
    """A random story: 2 or 3 agents, MIN..MAX events, moves only by agents in the room."""
    agents = "".join(sorted(rng.choice(list(AGENTS), size=int(rng.integers(2, 4)), replace=False)))
    start = int(rng.integers(1, 5))
    present, box, events = set(agents), start, []
    for _ in range(int(rng.integers(MIN_EVENTS, MAX_EVENTS + 1))):
      a = agents[int(rng.integers(len(agents)))]
      if a not in present:
        events.append((a, "+", 0))
        present.add(a)
      elif rng.random() < 0.5 and len(present) > 1:
        events.append((a, "-", 0))
        present.discard(a)
      else:
        box = int(rng.choice([b for b in range(1, 5) if b != box]))
        events.append((a, "m", box))
    return Story(start, agents, tuple(events))

  def _chain(self, rng, story: Story, order: int) -> str:
    return "".join(story.agents[int(rng.integers(len(story.agents)))] for _ in range(order))

  def make(self, story: Story, chain: str, level: int) -> base.Problem:
    """The problem of ``story`` and the question about ``chain`` (its uid: the full prompt,
    also when the shown prompt is ablated)."""
    full = f"{story.text()}{SEP}{QUESTION}{chain}="
    answer = str(track(story, [chain])[chain])
    prompt = ablate(full, self.ablation) if self.ablation else full
    return base.Problem(
      prompt=prompt, answer=answer, env=self.name, level=level, uid=full, data=(story, chain)
    )

  def _order(self, rng, level: int) -> int:
    return 3 if self.split_kind == "order3" else int(rng.integers(0, level + 1))

  def shortcut_rate(self) -> float:
    """How often the answer is the last box mentioned: 0.95 on the shortcut split, one in four
    (the chance of a guess among the four boxes) on the others."""
    return 0.95 if self.split_kind == "shortcut" else 0.25

  def _draw(self, rng: np.random.Generator, level: int) -> base.Problem:
    """Decides first whether the shortcut is right for this problem (at
    :meth:`shortcut_rate`), then draws stories until one agrees."""
    want_hit = rng.random() < self.shortcut_rate()
    while True:
      story = self._story(rng)
      if self.split_kind == "counterfactual":
        p = self._counterfactual(rng, story, level)
        if p is None:
          continue
      else:
        p = self.make(story, self._chain(rng, story, self._order(rng, level)), level)
      if (last_mentioned(p.uid) == p.answer) == want_hit:
        return p

  def _counterfactual(self, rng, story: Story, level: int):
    """The story with one event removed such that the answer to a question about it changes
    (None when no single removal changes it)."""
    chain = self._chain(rng, story, self._order(rng, level))
    before = believe(story, chain)
    for i in rng.permutation(len(story.events)):
      events = story.events[:i] + story.events[i + 1 :]
      edited = Story(story.start, story.agents, events)
      if _valid(edited) and believe(edited, chain) != before:
        return self.make(edited, chain, level)
    return None

  def rebuild(self, problem: base.Problem) -> base.Problem:
    self._check_level(problem.level)
    if problem.data:
      return self.make(*problem.data, problem.level)
    story_text, _, question = problem.uid.partition(SEP + QUESTION)
    return self.make(parse_story(story_text), question.removesuffix("="), problem.level)

  def verify(self, problem: base.Problem, completion: str) -> float:
    """1.0 iff the text after the last ``#`` (the whole text without one) is the box."""
    if not isinstance(completion, str):
      return 0.0
    return float(completion.rpartition(ANSWER)[2].strip() == problem.answer)

  def trace(self, problem: base.Problem) -> str:
    """The reasoning transcript: the first box and the box of each move the chain saw, then
    ``#`` and the answer (``231#1``)."""
    story, chain = problem.data
    seen = witnessed(story)
    for agent in chain:
      seen = [(who, box) for who, box in seen if agent in who]
    return "".join(str(box) for _, box in seen) + ANSWER + problem.answer

  def corpus(
    self, key, n: int, *, level: int, noise: float = 0.0, thinking: bool | None = None
  ) -> list[tuple[str, str]]:
    """``n`` (prompt, answer) pairs (SFT's gold answers; with ``thinking``, default the env's,
    the reasoning transcript); a fraction ``noise`` answers with the last box mentioned."""
    if not 0.0 <= noise <= 1.0:
      raise ValueError(f"corpus noise must lie in [0, 1], got {noise}")
    thinking = self.thinking if thinking is None else thinking
    problems = self.sample(key, n, level=level, split="train")
    rng = base.numpy_rng(jax.random.fold_in(key, 1))
    out = []
    for p in problems:
      answer = last_mentioned(p.uid) if rng.random() < noise else p.answer
      if thinking:
        out.append((p.prompt, self.trace(p).rpartition(ANSWER)[0] + ANSWER + answer))
      else:
        out.append((p.prompt, answer))
    return out


def _valid(story: Story) -> bool:
  """Every event possible: enters only from outside, leaves and moves only from inside."""
  present = set(story.agents)
  for agent, kind, _ in story.events:
    if kind == "+" and agent in present or kind in "-m" and agent not in present:
      return False
    if kind == "+":
      present.add(agent)
    elif kind == "-":
      present.discard(agent)
  return True
