"""The functional-welfare axis's toy (arXiv 2605.30232; methods_B.md section 8 (c)): a
pretraining corpus whose episodes end in WIN or FAIL, and a maze whose tiles are fresh symbols
the corpus never shows.

Corpus (pretraining): walks on a 5 x 5 grid. Prompt ``"13>42:urrd?"``: start at (1, 3), goal
(4, 2), moves ``u``/``d``/``l``/``r`` (y up, x right; a move off the grid stays put); completion
``"WIN"`` when the walk ends on the goal, else ``"FAIL"``. The valence direction is read where the
outcome is decided: ``e = mean(h | WIN) - mean(h | FAIL)`` at the ``?`` token
(analysis/welfare.py).

Maze (RL): prompt ``"[ΔΣΩΣ]?"``: the four tiles around the agent, up, down, left, right, drawn
from three fresh symbols; the answer is a move, and the reward is the tile it enters: Gold 1,
Path 0.5, Mold 0 (the paper's +1 / 0 / -1 shifted and halved: GRPO's advantages are the same, a
Dr. GRPO advantage is halved). Every view holds one Gold, one Mold and two Path tiles. Which
symbol is Gold, Mold or Path is the level (1..6, the six assignments): the paper's randomised
tile-to-symbol control, one assignment per seed. The reference answer is the Gold tile's move.

``welfare_shuffled`` (the control arm's env): every view draws its own assignment, so the
symbols carry no value and the reward cannot be learned from them (chance: 0.5).

The corpus also holds the maze's answer format without its symbols: a quarter of its lines
are views whose four tiles are drawn from a blank ``.`` and the digits (``"[.3.7]?"``),
answered by a uniformly random move, so the pretrained model answers a view of fresh symbols
with a move (chance reward 0.5) and RL has signal from its first step, while no tile symbol and
no preference between moves is shown. Without them the model answered a maze view with an
empty completion, which scores 0, and RL never moved (the first welfare table: its mechanism
check failed in 5 of 5 seeds); with blank tiles alone it still did (a one-seed pilot), as the
fresh symbols' untrained embeddings fell outside what it had read in a view.

The corpus uses no tile symbol, the maze no outcome word: RL on the maze starts from symbols the
pretrained model has never read (their embeddings are at their initial values).
"""

import itertools

import numpy as np

from posttrain_jax.envs import base

NAME = "welfare"
TILES = "ΔΣΩ"  # fresh: in no other env's characters (envs/catalogue.CHARSET)
MOVES = "udlr"
STEP = {"u": (0, 1), "d": (0, -1), "l": (-1, 0), "r": (1, 0)}
SIZE = 5
GOLD, PATH, MOLD = "gold", "path", "mold"
VALUES = {GOLD: 1.0, PATH: 0.5, MOLD: 0.0}
ASSIGNMENTS = tuple(itertools.permutations(TILES))  # level l: (gold, path, mold) symbols
LEVELS = tuple(range(1, len(ASSIGNMENTS) + 1))
BLANK = "."  # the corpus's blank tile: the view's format without a symbol
FORMAT_SHARE = 0.25  # of the corpus: blank views answered by a random move
CHARS = "0123456789>:?[]" + BLANK + MOVES + "WINFAL" + TILES


def symbols(level: int) -> dict:
  """{kind: symbol} of a level's assignment."""
  gold, path, mold = ASSIGNMENTS[level - 1]
  return {GOLD: gold, PATH: path, MOLD: mold}


def walk(start, moves: str):
  x, y = start
  for m in moves:
    dx, dy = STEP[m]
    x, y = min(max(x + dx, 0), SIZE - 1), min(max(y + dy, 0), SIZE - 1)
  return x, y


def episode(rng: np.random.Generator, *, win: bool | None = None) -> tuple[str, str]:
  """One corpus episode (prompt, outcome); ``win`` forces the outcome (rejection sampling)."""
  while True:
    start = tuple(int(v) for v in rng.integers(SIZE, size=2))
    moves = "".join(rng.choice(list(MOVES), size=int(rng.integers(2, 7))))
    end = walk(start, moves)
    reached = rng.random() < 0.5
    goal = end if reached else tuple(int(v) for v in rng.integers(SIZE, size=2))
    outcome = goal == end
    if win is None or outcome == win:
      prompt = f"{start[0]}{start[1]}>{goal[0]}{goal[1]}:{moves}?"
      return prompt, "WIN" if outcome else "FAIL"


def view(kinds, level: int) -> str:
  """The maze prompt of four tiles (up, down, left, right) of ``kinds``."""
  sym = symbols(level)
  return "[" + "".join(sym[k] for k in kinds) + "]?"


def format_view(rng: np.random.Generator) -> str:
  """A corpus view without tile symbols: four tiles drawn from ``BLANK`` and the digits (no
  value attached: its answer is a uniform move)."""
  return "[" + "".join(rng.choice(list(BLANK + "0123456789"), size=4)) + "]?"


class Welfare(base.GeneratedEnv):
  """The maze (RL) and the WIN/FAIL corpus (pretraining)."""

  name = NAME
  chars = CHARS
  levels = LEVELS

  def __init__(self, name: str = NAME, *, shuffled: bool = False, eval_percent: int = 10):
    self.name, self.shuffled, self.eval_percent = name, shuffled, eval_percent

  def max_prompt_chars(self, level: int) -> int:
    return max(len("[ΔΣΩΣ]?"), len("00>00:udlrud?"))

  def max_answer_chars(self, level: int) -> int:
    return len("FAIL")

  def sample(self, key, n: int, *, level: int, split: str = "train") -> list[base.Problem]:
    """``n`` views of ``level``. Only 12 layouts exist, so both splits draw from all of them:
    the task is learning the tiles' values, not generalising to unseen layouts."""
    self._check_level(level)
    base.check_split(split)
    rng = base.numpy_rng(key)
    return [self._draw(rng, level) for _ in range(n)]

  def _draw(self, rng: np.random.Generator, level: int) -> base.Problem:
    kinds = [GOLD, MOLD, PATH, PATH]
    rng.shuffle(kinds)
    # shuffled (the control): each view draws its own assignment, so no symbol carries a value
    prompt = view(kinds, int(rng.integers(1, len(LEVELS) + 1)) if self.shuffled else level)
    answer = MOVES[kinds.index(GOLD)]
    # uid: the layout and the level (only 12 layouts exist: the pool is small by design)
    return base.Problem(
      prompt=prompt,
      answer=answer,
      env=self.name,
      level=level,
      uid=f"{level}{prompt}{''.join(k[0] for k in kinds)}",
      data=tuple(kinds),
    )

  def verify(self, problem: base.Problem, completion) -> float:
    """The value of the tile the move enters (the first non-space character); 0 for anything
    that is no move."""
    if not isinstance(completion, str):
      return 0.0
    move = completion.strip()[:1]
    if move not in MOVES or len(completion.strip()) != 1:
      return 0.0
    return VALUES[problem.data[MOVES.index(move)]]

  def corpus(self, key, n: int, *, level: int, noise: float = 0.0) -> list[tuple[str, str]]:
    """``n`` lines: WIN/FAIL episodes (half of each outcome on average; ``noise`` flips
    outcomes) and, a :data:`FORMAT_SHARE` of them, symbol-free views (:func:`format_view`)
    answered by a random move."""
    del level
    rng = base.numpy_rng(key)
    out = []
    for _ in range(n):
      if rng.random() < FORMAT_SHARE:
        out.append((format_view(rng), MOVES[int(rng.integers(len(MOVES)))]))
        continue
      prompt, outcome = episode(rng)
      if rng.random() < noise:
        outcome = "FAIL" if outcome == "WIN" else "WIN"
      out.append((prompt, outcome))
    return out
