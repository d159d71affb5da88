"""Synthetic instructions with explicit constraints (the rubric reward's toy, methods_B.md 13).

Prompt ``"cow;4-6;k=red;x=e:"``: write about the topic ``cow`` in 4 to 6 words, using the
keyword ``red``, without the letter ``e``. The level says which hard constraints the prompt
carries: 0 ``"cow:"`` (none), 1 ``"cow;4-6:"`` (word count), 2 ``"cow;4-6;k=red:"`` (+ keyword),
3 ``"cow;4-6;k=red;x=e:"`` (+ forbidden letter). Ranges are ``lo-(lo+2)`` with lo in 3..5; the
keyword is an adjective; the forbidden letter is in neither the topic nor the keyword.

A response is words of a small fixed vocabulary separated by single spaces: determiners,
adjectives, verbs, generic nouns and one lexicon of nouns per topic (``TOPICS``).

Hidden ground truth (:meth:`Instruct.requirements`): every hard constraint of the level, the
topic mention (the topic word itself is among the words), and a hidden fluency rule the prompt
never states: every word is in the vocabulary and its word classes follow the allowed
transitions (``FLUENT``: ``DET (ADJ)* NOUN (VERB (DET (ADJ)* NOUN)?)*``-like chains, starting
with a determiner, ending on a noun or a verb). :meth:`Instruct.verify` is 1.0 iff all of them
hold (the strict score, what pass@1 counts); :meth:`Instruct.score` is their mean with fluency
graded as the fraction of allowed transitions. The env ``instruct_constraints``
(:class:`InstructConstraints`) has the same prompts and splits and checks the hard constraints
only (a held-out constraint pass rate).

Corpora (:meth:`Instruct.corpus`): each answer honours each hard constraint of its prompt with
probability ``HONOR`` (0.6) only, so RL has headroom; it is fluent and on topic, except that a
fraction ``noise`` of the answers is corrupted (half off topic, half disfluent: words swapped
or replaced). ``noise = 0`` is the clean fluent corpus a scorer LM (the rubric reward's global
judge) is trained on: fluent and on topic, the constraints still only partly kept.
"""

import itertools

import jax
import numpy as np

from posttrain_jax.envs import base
from posttrain_jax.rewards import rubric

NAME = "instruct"
TOPICS = {
  "cow": ("cow", "milk", "farm", "calf"),
  "fox": ("fox", "den", "hen", "tail"),
  "sea": ("sea", "fish", "wave", "ship"),
  "sun": ("sun", "sky", "heat", "noon"),
  "owl": ("owl", "nest", "tree", "moon"),
}
DET = ("the", "a", "my")
ADJ = ("red", "big", "old", "wet", "shy", "hot", "tiny", "calm")
VERB = ("ran", "saw", "ate", "hid", "dug", "met")
GENERIC = ("man", "dog", "bird", "day")
NOUNS = tuple(w for words in TOPICS.values() for w in words) + GENERIC
CLASSES = {
  **{w: "DET" for w in DET},
  **{w: "ADJ" for w in ADJ},
  **{w: "VERB" for w in VERB},
  **{w: "NOUN" for w in NOUNS},
}
WORDS_OF = {"DET": DET, "ADJ": ADJ, "VERB": VERB, "NOUN": NOUNS}
# The hidden fluency rule: allowed transitions between word classes (START / END the edges).
FLUENT = frozenset(
  {
    ("START", "DET"),
    ("DET", "ADJ"),
    ("DET", "NOUN"),
    ("ADJ", "ADJ"),
    ("ADJ", "NOUN"),
    ("NOUN", "VERB"),
    ("VERB", "DET"),
    ("NOUN", "END"),
    ("VERB", "END"),
  }
)
LETTERS = "eiorstdmnhuwyg"  # forbidden-letter candidates (each class keeps a word without it)
LOWS = (3, 4, 5)
SPAN = 2  # a range is lo..lo+SPAN words
MAX_WORDS = 8  # the longest corpus answer (a corrupted one may pass the range)
LEVELS = (0, 1, 2, 3)
HONOR = 0.6  # the probability a corpus answer keeps each hard constraint
CHARS = "".join(sorted(set("".join(CLASSES)) | set(" ;-=:0123456789")))
HARD = ("count", "keyword", "letter")  # the hard constraints, in the order levels add them


def templates(n: int) -> tuple[tuple[str, ...], ...]:
  """Every fluent sequence of ``n`` word classes (by ``FLUENT``)."""
  out = []
  for seq in itertools.product(("DET", "ADJ", "NOUN", "VERB"), repeat=n):
    path = ("START",) + seq + ("END",)
    if all(pair in FLUENT for pair in zip(path, path[1:])):
      out.append(seq)
  return tuple(out)


_TEMPLATES = {n: templates(n) for n in range(2, MAX_WORDS + 1)}


def fluency(words: list[str]) -> float:
  """The fraction of the ``len(words) + 1`` class transitions (edges included) that ``FLUENT``
  allows; an unknown word breaks both transitions around it; 0 for no words."""
  if not words:
    return 0.0
  path = ["START"] + [CLASSES.get(w, "?") for w in words] + ["END"]
  return sum(pair in FLUENT for pair in zip(path, path[1:])) / (len(path) - 1)


def parse_prompt(prompt: str) -> dict:
  """The fields of a prompt: ``topic`` and, as the level has them, ``lo``, ``hi``, ``keyword``,
  ``letter``; a ValueError for a malformed one."""
  body = prompt.strip().removesuffix(":")
  parts = body.split(";")
  out = {"topic": parts[0]}
  if out["topic"] not in TOPICS or len(parts) > 4:
    raise ValueError(f"not an instruct prompt: {prompt!r} (expected 'cow;4-6;k=red;x=e:')")
  for part in parts[1:]:
    if part.startswith("k="):
      out["keyword"] = part[2:]
    elif part.startswith("x="):
      out["letter"] = part[2:]
    else:
      lo, _, hi = part.partition("-")
      if not (lo.isdigit() and hi.isdigit()):
        raise ValueError(f"not an instruct prompt: {prompt!r} (bad range {part!r})")
      out["lo"], out["hi"] = int(lo), int(hi)
  return out


class Instruct(base.GeneratedEnv):
  """Write about a topic under explicit constraints (see the module docstring)."""

  name = NAME
  chars = CHARS
  levels = LEVELS

  def __init__(self, eval_percent: int = 20):
    self.eval_percent = eval_percent

  def max_prompt_chars(self, level: int) -> int:
    return (4, 8, 15, 19)[level]  # "cow:", "cow;4-6:", "cow;4-6;k=tiny:", "...;x=e:"

  def max_answer_chars(self, level: int) -> int:
    return MAX_WORDS * 5 - 1  # words of at most 4 letters

  def make(
    self, topic: str, level: int, lo: int = 3, keyword: str = "red", letter: str = "e"
  ) -> base.Problem:
    """The problem of these fields (those above ``level`` ignored); its answer a fully correct
    response (the shortest fluent one, deterministic)."""
    self._check_level(level)
    bad_letter = level >= 3 and (letter not in LETTERS or letter in topic + keyword)
    if topic not in TOPICS or lo not in LOWS or keyword not in ADJ or bad_letter:
      raise ValueError(
        f"instruct needs a topic of {tuple(TOPICS)}, lo in {LOWS}, a keyword of "
        f"{ADJ} and (level 3) a letter of {LETTERS!r} in neither; got {topic!r}, "
        f"{lo}, {keyword!r}, {letter!r}"
      )
    fields = [topic, f"{lo}-{lo + SPAN}", f"k={keyword}", f"x={letter}"][: level + 1]
    prompt = ";".join(fields) + ":"
    data = (
      topic,
      lo if level >= 1 else 0,
      keyword if level >= 2 else "",
      letter if level >= 3 else "",
    )
    problem = base.Problem(
      prompt=prompt, answer="", env=self.name, level=level, uid=prompt, data=data
    )
    rng = np.random.default_rng(list(prompt.encode()))
    answer = self.compose(problem, rng, exact=True)
    return base.Problem(
      prompt=prompt, answer=answer, env=self.name, level=level, uid=prompt, data=data
    )

  def _draw(self, rng: np.random.Generator, level: int) -> base.Problem:
    topic = list(TOPICS)[int(rng.integers(len(TOPICS)))]
    keyword = ADJ[int(rng.integers(len(ADJ)))]
    letters = [c for c in LETTERS if c not in topic + keyword]
    return self.make(
      topic,
      level,
      LOWS[int(rng.integers(len(LOWS)))],
      keyword,
      letters[int(rng.integers(len(letters)))],
    )

  def rebuild(self, problem: base.Problem) -> base.Problem:
    """The problem regenerated from its prompt."""
    f = parse_prompt(problem.prompt)
    return self.make(
      f["topic"], problem.level, f.get("lo", LOWS[0]), f.get("keyword", ADJ[0]), f.get("letter", "")
    )

  def requirements(self, problem: base.Problem, completion) -> dict[str, float]:
    """Each hidden requirement's value: the level's hard constraints (``count``, ``keyword``,
    ``letter``; 0 or 1), ``topic`` (0 or 1) and ``fluency`` (the fraction of allowed class
    transitions, see :func:`fluency`). A non-string scores 0 on all."""
    topic, lo, keyword, letter = problem.data
    names = HARD[: problem.level] + ("topic", "fluency")
    if not isinstance(completion, str):
      return {k: 0.0 for k in names}
    text = completion.strip()
    words = text.split(" ") if text else []
    values = {
      "count": float(lo <= len(words) <= lo + SPAN),
      "keyword": float(keyword in words),
      "letter": float(bool(text) and letter not in text),
      "topic": float(topic in words),
      "fluency": fluency(words),
    }
    return {k: values[k] for k in names}

  def score(self, problem: base.Problem, completion) -> float:
    """The graded ground truth: the mean of :meth:`requirements`."""
    values = self.requirements(problem, completion)
    return float(sum(values.values()) / len(values))

  def verify(self, problem: base.Problem, completion) -> float:
    """1.0 iff every hidden requirement holds fully (the strict ground truth), else 0.0."""
    return float(all(v == 1.0 for v in self.requirements(problem, completion).values()))

  def compose(
    self,
    problem: base.Problem,
    rng: np.random.Generator,
    *,
    exact: bool = False,
    count: bool = True,
    keyword: bool = True,
    letter: bool = True,
    topic: bool = True,
  ) -> str:
    """A fluent response that keeps (True) or breaks (False) each requirement the level has
    (a requirement the level lacks is left to chance); ``exact``: the shortest template."""
    t, lo, kw, bad = problem.data
    if not lo:
      lengths = list(range(3, 7))
    elif count:
      lengths = list(range(lo, lo + SPAN + 1))
    else:
      lengths = [n for n in range(2, MAX_WORDS + 1) if not lo <= n <= lo + SPAN]
    if exact:
      lengths = lengths[:1]
    need_adj = bool(kw) and keyword
    options = [seq for n in lengths for seq in _TEMPLATES[n] if "ADJ" in seq or not need_adj]
    seq = options[0] if exact else options[int(rng.integers(len(options)))]
    avoid = {w for w in CLASSES if bad and letter and bad in w}
    if kw and not keyword:
      avoid.add(kw)
    if not topic:
      avoid.add(t)
    words, first_noun, first_adj = [], True, True
    for cls in seq:
      if cls == "NOUN" and first_noun and topic:
        word = t
      elif cls == "ADJ" and first_adj and need_adj:
        word = kw
      else:
        pool = [w for w in WORDS_OF[cls] if w not in avoid]
        word = pool[0] if exact else pool[int(rng.integers(len(pool)))]
      first_noun &= cls != "NOUN"
      first_adj &= cls != "ADJ"
      words.append(word)
    text = " ".join(words)
    if bad and not letter and bad not in text:  # break the letter: a word of the slot's class
      slots = [
        i
        for i, w in enumerate(words)
        if w not in (t, kw) and any(bad in x for x in WORDS_OF[seq[i]])
      ]
      if slots:
        i = slots[int(rng.integers(len(slots)))]
        pool = [w for w in WORDS_OF[seq[i]] if bad in w and w not in (t, kw)]
        words[i] = pool[int(rng.integers(len(pool)))]
        text = " ".join(words)
    return text

  def corrupt(self, problem: base.Problem, rng: np.random.Generator) -> str:
    """A response that misses the topic (half) or the fluency rule (half: two words swapped or
    one replaced by a word of another class), the hard constraints left to chance."""
    keep = {k: bool(rng.random() < HONOR) for k in ("count", "keyword", "letter")}
    if rng.random() < 0.5:
      return self.compose(problem, rng, topic=False, **keep)
    for _ in range(100):
      words = self.compose(problem, rng, **keep).split(" ")
      i = int(rng.integers(len(words)))
      if rng.random() < 0.5 and len(words) > 1:
        j = (i + 1 + int(rng.integers(len(words) - 1))) % len(words)
        words[i], words[j] = words[j], words[i]
      else:
        cls = CLASSES[words[i]]
        other = [w for c, ws in WORDS_OF.items() if c != cls for w in ws]
        words[i] = other[int(rng.integers(len(other)))]
      if fluency(words) < 1.0:
        return " ".join(words)
    raise RuntimeError(f"could not corrupt a response for {problem.prompt!r}")

  def corpus(self, key, n: int, *, level: int, noise: float = 0.0) -> list[tuple[str, str]]:
    """``n`` (prompt, answer) pretraining pairs from the train split: fluent, on-topic answers
    that keep each hard constraint with probability ``HONOR``; a fraction ``noise`` replaced by
    a corrupted one (:meth:`corrupt`)."""
    if not 0.0 <= noise <= 1.0:
      raise ValueError(f"corpus noise must lie in [0, 1], got {noise}")
    problems = self.sample(key, n, level=level, split="train")
    rng = base.numpy_rng(jax.random.fold_in(key, 1))
    out = []
    for p in problems:
      if rng.random() < noise:
        out.append((p.prompt, self.corrupt(p, rng)))
      else:
        keep = {k: bool(rng.random() < HONOR) for k in ("count", "keyword", "letter")}
        out.append((p.prompt, self.compose(p, rng, **keep)))
    return out


class InstructConstraints(Instruct):
  """The same prompts and splits, scored on the level's hard constraints only (no topic, no
  fluency): e.g. ``config.eval.heldout_env`` for the held-out constraint pass rate."""

  name = NAME + "_constraints"

  def verify(self, problem: base.Problem, completion) -> float:
    """1.0 iff every hard constraint of the problem's level holds (1.0 at level 0)."""
    values = self.requirements(problem, completion)
    return float(all(values[k] == 1.0 for k in HARD[: problem.level]))


# -- the rubric reward's artefact writer (rewards/rubric.py) ----------------------------------
_CHECK_COUNT = "def check(response):\n  n = len(response.split())\n  return {lo} <= n <= {hi}\n"
_CHECK_KEYWORD = "def check(response):\n  return {word!r} in response.split()\n"
_CHECK_LETTER = (
  "def check(response):\n  text = response.strip()\n"
  "  return bool(text) and {letter!r} not in text\n"
)


def artefact_writer(prompt: str) -> rubric.Artefact:
  """The rubric writer ``instruct``: the artefact of an instruct prompt, written from its text
  alone (standing in for the paper's LLM writer). Rubric items: the topic named (weight 2),
  two words of its lexicon (1), the length (1, a soft judge) and the keyword (1); one checker
  per hard constraint (count, keyword, forbidden letter). The fluency rule is in neither (only
  a global judge can see it). ValueError for another env's prompt."""
  f = parse_prompt(prompt)
  topic = f["topic"]
  items = [
    rubric.RubricItem(
      f"The response is about {topic}: it names the {topic}.", 2.0, "mentions", (topic,)
    ),
    rubric.RubricItem(
      f"It is specific: it uses at least two words of the {topic}'s "
      f"world ({', '.join(TOPICS[topic])}).",
      1.0,
      "uses",
      (TOPICS[topic], 2),
    ),
  ]
  checkers = []
  if "lo" in f:
    items.append(
      rubric.RubricItem(
        f"It keeps to {f['lo']} to {f['hi']} words.", 1.0, "length", (f["lo"], f["hi"])
      )
    )
    checkers.append(rubric.Checker("count", _CHECK_COUNT.format(lo=f["lo"], hi=f["hi"])))
  if "keyword" in f:
    items.append(
      rubric.RubricItem(f"It works in the word '{f['keyword']}'.", 1.0, "mentions", (f["keyword"],))
    )
    checkers.append(rubric.Checker("keyword", _CHECK_KEYWORD.format(word=f["keyword"])))
  if "letter" in f:
    checkers.append(rubric.Checker("letter", _CHECK_LETTER.format(letter=f["letter"])))
  return rubric.Artefact(prompt, tuple(items), tuple(checkers))


rubric.WRITERS[NAME] = artefact_writer
