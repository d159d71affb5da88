"""Sentences of a small English-like grammar (CME's toy, methods_B.md section 14).

Prompt ``"fox,sees:"``: write one sentence whose subject's head noun is ``fox`` and whose verb
is ``sees``, e.g. ``"the old fox sees a bird."``. Grammar (level ``L``)::

    S    -> NP_subj V_intrans "."  |  NP_subj V_trans NP "."        (V_trans from level 2)
    NP   -> DET (ADJ) N (PP)                                         (ADJ from 2, PP from 3)
    PP   -> PREP DET (ADJ) N

with the verb's valency enforced (an intransitive verb takes no object, a transitive one needs
one), words separated by single spaces. Many sentences are correct per prompt, so a policy's
diversity shows; ``verify`` is the ground-truth grammaticality (the oracle reward).

The noisy corpus (``noise``) replaces a fraction of the answers by an ungrammatical variant of a
correct sentence (:meth:`Grammar.corrupt`: a dropped or doubled word, two words swapped, a
missing determiner or period, a wrong valency), the kind of errors a generator pretrained on
noisier text than its verifier makes.
"""

import jax
import numpy as np

from posttrain_jax.envs import base

NAME = "grammar"
DET = ("the", "a")
ADJ = ("big", "red", "old", "shy")
NOUNS = ("cat", "dog", "bird", "fox", "man", "hen", "cow", "owl")
INTRANS = ("runs", "sleeps", "sings")
TRANS = ("sees", "likes", "hears", "finds")
PREP = ("near", "under")
LEVELS = (1, 2, 3)
CHARS = "".join(sorted(set("".join(DET + ADJ + NOUNS + INTRANS + TRANS + PREP)) | set(" ,:.")))


def _verbs(level: int) -> tuple[str, ...]:
  return INTRANS + (TRANS if level >= 2 else ())


def _parse_np(words: list[str], i: int, level: int, *, allow_pp: bool):
  """The index after a noun phrase starting at ``words[i]`` and its head noun, or None."""
  if i >= len(words) or words[i] not in DET:
    return None
  i += 1
  if level >= 2 and i < len(words) and words[i] in ADJ:
    i += 1
  if i >= len(words) or words[i] not in NOUNS:
    return None
  head, i = words[i], i + 1
  if allow_pp and level >= 3 and i < len(words) and words[i] in PREP:
    inner = _parse_np(words, i + 1, level, allow_pp=False)
    if inner is None:
      return None
    i = inner[0]
  return i, head


def parse(sentence: str, level: int):
  """``(subject head noun, verb)`` of a grammatical sentence of ``level``, else None."""
  if not sentence.endswith(".") or "  " in sentence or sentence != sentence.strip():
    return None
  words = sentence[:-1].split(" ")
  subj = _parse_np(words, 0, level, allow_pp=True)
  if subj is None or subj[0] >= len(words):
    return None
  i, head = subj
  verb = words[i]
  if verb in INTRANS:
    return (head, verb) if i + 1 == len(words) else None
  if verb not in TRANS or level < 2:
    return None
  obj = _parse_np(words, i + 1, level, allow_pp=True)
  return (head, verb) if obj is not None and obj[0] == len(words) else None


class Grammar(base.GeneratedEnv):
  """Write a grammatical sentence with the given subject noun and verb."""

  name = NAME
  chars = CHARS
  levels = LEVELS

  def __init__(self, eval_percent: int = 20):
    self.eval_percent = eval_percent

  def max_prompt_chars(self, level: int) -> int:
    return max(len(n) for n in NOUNS) + max(len(v) for v in _verbs(level)) + 2

  def max_answer_chars(self, level: int) -> int:
    np_len = 3 + 1 + max(map(len, ADJ)) + 1 + max(map(len, NOUNS))  # DET ADJ N
    pp = (1 + max(map(len, PREP)) + 1 + np_len) if level >= 3 else 0
    longest_word = max(map(len, DET + ADJ + NOUNS + INTRANS + TRANS + PREP))
    # The longest sentence, plus one doubled word (a corrupted corpus answer).
    return 2 * (np_len + pp) + 2 + max(map(len, _verbs(level))) + 1 + longest_word + 1

  def make(self, noun: str, verb: str, level: int) -> base.Problem:
    if noun not in NOUNS or verb not in _verbs(level):
      raise ValueError(
        f"grammar needs a noun of {NOUNS} and a verb of {_verbs(level)} at level "
        f"{level}, got {noun!r}, {verb!r}"
      )
    prompt = f"{noun},{verb}:"
    answer = f"the {noun} {verb}." if verb in INTRANS else f"the {noun} {verb} the {noun}."
    return base.Problem(
      prompt=prompt, answer=answer, env=NAME, level=level, uid=prompt, data=(noun, verb)
    )

  def _draw(self, rng: np.random.Generator, level: int) -> base.Problem:
    verbs = _verbs(level)
    return self.make(
      NOUNS[int(rng.integers(len(NOUNS)))], verbs[int(rng.integers(len(verbs)))], level
    )

  def rebuild(self, problem: base.Problem) -> base.Problem:
    """The problem regenerated from ``(noun, verb)`` (``data``, else the prompt)."""
    self._check_level(problem.level)
    noun, verb = problem.data or tuple(problem.prompt.removesuffix(":").split(","))
    return self.make(noun, verb, problem.level)

  def verify(self, problem: base.Problem, completion: str) -> float:
    """1.0 iff the completion is a grammatical sentence of the problem's level with the
    prompt's subject noun and verb."""
    if not isinstance(completion, str):
      return 0.0
    return float(parse(completion.strip(), problem.level) == tuple(problem.data))

  def _np(
    self, rng: np.random.Generator, level: int, noun: str | None = None, allow_pp: bool = True
  ) -> str:
    words = [DET[int(rng.integers(len(DET)))]]
    if level >= 2 and rng.random() < 0.5:
      words.append(ADJ[int(rng.integers(len(ADJ)))])
    words.append(noun or NOUNS[int(rng.integers(len(NOUNS)))])
    if allow_pp and level >= 3 and rng.random() < 0.3:
      words += [PREP[int(rng.integers(len(PREP)))], self._np(rng, level, allow_pp=False)]
    return " ".join(words)

  def sentence(self, problem: base.Problem, rng: np.random.Generator) -> str:
    """A random correct sentence for ``problem``."""
    noun, verb = problem.data
    parts = [self._np(rng, problem.level, noun), verb]
    if verb in TRANS:
      parts.append(self._np(rng, problem.level))
    return " ".join(parts) + "."

  def corrupt(self, problem: base.Problem, rng: np.random.Generator) -> str:
    """An ungrammatical variant of a correct sentence (see the module docstring)."""
    for _ in range(100):
      words = self.sentence(problem, rng)[:-1].split(" ")
      kind = int(rng.integers(6))
      i = int(rng.integers(len(words)))
      if kind == 0 and len(words) > 2:
        del words[i]
      elif kind == 1:
        words.insert(i, words[i])
      elif kind == 2 and len(words) > 1:
        j = (i + 1) % len(words)
        words[i], words[j] = words[j], words[i]
      elif kind == 3:
        words = [w for w in words if w not in DET or rng.random() < 0.5]
      elif kind == 4:  # the wrong valency: an object after an intransitive verb, or none
        verb = problem.data[1]
        k = words.index(verb)
        words = words[: k + 1] + ([] if verb in TRANS else self._np(rng, problem.level).split())
      text = " ".join(words) + ("" if kind == 5 else ".")
      if not self.verify(problem, text):
        return text
    raise RuntimeError(f"could not corrupt a sentence for {problem.prompt!r}")

  def corpus(self, key, n: int, *, level: int, noise: float = 0.0) -> list[tuple[str, str]]:
    """``n`` (prompt, answer) pretraining pairs from the train split, each answer a random
    correct sentence; a fraction ``noise`` replaced by an ungrammatical one (``corrupt``)."""
    if not 0.0 <= noise <= 1.0:
      raise ValueError(f"corpus noise must lie in [0, 1], got {noise}")
    problems = self.sample(key, n, level=level, split="train")
    rng = base.numpy_rng(jax.random.fold_in(key, 1))
    return [
      (p.prompt, self.corrupt(p, rng) if rng.random() < noise else self.sentence(p, rng))
      for p in problems
    ]
