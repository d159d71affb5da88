"""CERO: adaptive rollout allocation under a global budget (Zong, Wang, Jiang; arXiv 2606.05606).

From the abstract: each prompt ``i`` has a Beta posterior over its success rate and the value of
more rollouts is the posterior expected Bernoulli variance

    v_i = E_{θ ~ Beta(a_i, b_i)}[θ (1 - θ)] = a_i b_i / ((a_i + b_i)(a_i + b_i + 1)),

with ``a_i = a0 + successes``, ``b_i = b0 + failures`` (fractional rewards in [0, 1] count as
fractional successes). Everything below is **derived** (research/methods_A.md section 6; the
paper's exact rules were not readable). Names follow the brief: ``lam`` is the budget dual (the
notes call it μ_t), ``mu_i`` the prompt duals (the notes' λ_p).

- Utility (concave, saturating) of the cumulative allocation ``N_i`` of prompt ``i``:

      U_i(N) = v_i s (1 - exp(-N / s)),    U_i'(N) = v_i exp(-N / s),    s = n_sat.

- Prompt dual (Fenchel): with the concave conjugate ``U_*(μ) = inf_N [μ N - U(N)]``,
  ``U(N) = inf_{μ >= 0} [μ N - U_*(μ)]`` and ``(U_*)'(μ) = N*(μ) = s ln(v_i / μ)`` on (0, v_i].
  Each visit takes one projected online (mirror) gradient step on ``μ N_i - U_*(μ)`` in log
  coordinates, projected onto ``[0, v_i]`` (a floor of 1e-300 keeps the log finite):

      ln mu_i <- ln mu_i - η_mu (N_i - N*(mu_i)) / s
              =  (1 - η_mu) ln mu_i + η_mu ln U_i'(N_i),

  so ``mu_i`` tracks the marginal utility ``U_i'(N_i)`` (exactly when ``η_mu = 1``).
- Allocation at step t: the k-th rollout of prompt ``i`` this step is worth the dual-linearised
  marginal ``mu_i exp(-(k-1)/s)`` (proportional to the exact increment ``U_i(N+k) - U_i(N+k-1)``
  when ``mu_i = U_i'(N_i)``). It is priced *relative to the batch*: with ``mu_ref`` the median
  of the batch's duals (taken in log space),

      m_i(k) = (mu_i / mu_ref) exp(-(k-1)/s),
      d_i    = clip(#{k in 1..G_max : m_i(k) >= lam}, G_min, G_max),

  and when ``Σ d_i > B_t`` the ``Σ d_i - B_t`` rollouts of lowest ``m_i(k)`` above ``G_min`` are
  dropped (ties: larger k, then later slot, first), so ``Σ n_i <= B_t`` at every step.
- Budget dual (projected OGD on the budget constraint, normalised by the budget):

      lam <- max(0, lam + η_lam (Σ_i d_i - B_t) / B_t).

  Why relative prices (ours): the duals ``mu_i`` shrink like ``exp(-N_i/s)`` as prompts are
  revisited, by orders of magnitude over a run. An absolute price ``lam`` then oscillated between
  0 (everyone ``G_max``) and above every marginal (everyone ``G_min``), and a multiplicative
  ``lam`` chased the decay with a steady shortfall of ``~ G/(s η)`` of the budget (both tried).
  With ``mu_ref`` the price is dimensionless (``lam = exp(-(G-1)/s)`` gives ``G`` to a typical
  prompt) and the allocation depends only on the batch's relative values. With all ``v_i``
  (and ``N_i``) equal the allocation is uniform (within 1 when ``P`` does not divide ``B_t``).

Behaviour to expect (measured on a simulated 64-prompt dataset): the optimum equalises
``v_i exp(-N_i/s)`` across prompts, so a prompt's *cumulative* allocation ends about
``s ln(v_j / v_i)`` rollouts below a more uncertain one; once those offsets exist, repeat visits
get similar sizes. The effect is therefore concentrated in a prompt's first ``~s/G`` visits
(a few epochs), and on a stream of never-repeated prompts (procedural envs) every prompt is
new and equal, so CERO is uniform unless ``level_prior > 0``.

The state is a JSON-safe dict and every function is pure (a new state is returned).
"""

import copy
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from posttrain_jax.scheduling import base

VERSION = 1
MU_FLOOR = 1e-300  # keeps logs finite; marginals span many decades


def init(
  *,
  g_min: int = 2,
  g_max: int = 16,
  a0: float = 1.0,
  b0: float = 1.0,
  n_sat: float = 16.0,
  lr_budget: float = 0.1,
  lr_prompt: float = 0.5,
  lam0: float = 0.5,
  level_prior: float = 0.0,
) -> dict:
  """A fresh CERO state.

  Args:
    g_min, g_max: bounds of every group size (``g_min >= 1``; 2 keeps a group advantage).
    a0, b0: Beta prior pseudo-counts of an unseen prompt.
    n_sat: saturation scale ``s`` of the utility.
    lr_budget: step ``η_lam`` of the budget dual.
    lr_prompt: step ``η_mu`` in (0, 1] of the prompt duals.
    lam0: initial budget dual (a relative price: ``exp(-(G-1)/s)`` asks ``G`` per prompt).
    level_prior: ours, not in the notes: when > 0, an unseen prompt's prior is shifted toward
      the pooled success rate ``m`` of its (env, level): ``Beta(a0 + k m, b0 + k (1 - m))`` with
      ``k = level_prior``. Useful when prompts are rarely revisited (procedural envs).
  """
  if not 1 <= g_min <= g_max:
    raise ValueError(f"need 1 <= g_min <= g_max, got g_min={g_min}, g_max={g_max}")
  if a0 <= 0 or b0 <= 0 or n_sat <= 0 or lam0 < 0 or lr_budget < 0 or level_prior < 0:
    raise ValueError("need a0, b0, n_sat > 0 and lam0, lr_budget, level_prior >= 0")
  if not 0.0 < lr_prompt <= 1.0:
    raise ValueError(f"need 0 < lr_prompt <= 1, got {lr_prompt}")
  config = {
    "g_min": int(g_min),
    "g_max": int(g_max),
    "a0": float(a0),
    "b0": float(b0),
    "n_sat": float(n_sat),
    "lr_budget": float(lr_budget),
    "lr_prompt": float(lr_prompt),
    "level_prior": float(level_prior),
  }
  # prompts: uid -> [a, b, cumulative rollouts N, prompt dual mu]; levels: key -> [succ, trials]
  return {
    "version": VERSION,
    "config": config,
    "lam": float(lam0),
    "steps": 0,
    "prompts": {},
    "levels": {},
    "spent": 0,
    "budget": 0,
  }


def expected_variance(a, b) -> np.ndarray:
  """``E[θ(1-θ)]`` under ``Beta(a, b)``: ``a b / ((a+b)(a+b+1))``; at most 1/4."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return a * b / ((a + b) * (a + b + 1.0))


def utility(n, v, *, n_sat: float) -> np.ndarray:
  """``U(N) = v s (1 - exp(-N/s))``: increasing, concave, saturating at ``v s``."""
  return np.asarray(v) * n_sat * (1.0 - np.exp(-np.asarray(n, np.float64) / n_sat))


def _level_key(problem) -> str | None:
  if isinstance(problem, str) or not hasattr(problem, "env"):
    return None
  return f"{problem.env}/{problem.level}"


def _prior(state: dict, problem) -> tuple[float, float]:
  cfg = state["config"]
  a, b = cfg["a0"], cfg["b0"]
  key = _level_key(problem)
  if cfg["level_prior"] > 0 and key in state["levels"]:
    succ, trials = state["levels"][key]
    m = (succ + 0.5) / (trials + 1.0)
    a, b = a + cfg["level_prior"] * m, b + cfg["level_prior"] * (1.0 - m)
  return a, b


def _entry(state: dict, problem) -> list:
  """``[a, b, N, mu]`` of a prompt (prior, 0 rollouts and ``mu = v`` when unseen)."""
  entry = state["prompts"].get(base.uid_of(problem))
  if entry is not None:
    return list(entry)
  a, b = _prior(state, problem)
  return [a, b, 0.0, float(expected_variance(a, b))]


def prompt_values(state: dict, problems: Sequence) -> dict[str, np.ndarray]:
  """``a, b, n (cumulative), mu, v`` of each prompt, each [P] float64."""
  rows = np.array([_entry(state, p) for p in problems], np.float64).reshape(-1, 4)
  return {
    "a": rows[:, 0],
    "b": rows[:, 1],
    "n": rows[:, 2],
    "mu": rows[:, 3],
    "v": expected_variance(rows[:, 0], rows[:, 1]),
  }


class Allocation(NamedTuple):
  """Group sizes ``[P]`` int32 (``Σ <= budget``), the unclipped demand ``Σ d_i`` and metrics."""

  group_sizes: np.ndarray
  demand: int
  budget: int
  metrics: dict


def marginals(mu, *, g_max: int, n_sat: float) -> np.ndarray:
  """[P, G_max] ``ln m_i(k) = ln(mu_i / mu_ref) - (k-1)/s`` for k = 1..G_max (log space)."""
  log_mu = np.log(np.maximum(np.asarray(mu, np.float64), MU_FLOOR))
  ref = np.median(log_mu) if log_mu.size else 0.0
  k = np.arange(g_max, dtype=np.float64)
  return (log_mu - ref)[:, None] - k[None, :] / n_sat


def allocate(state: dict, problems: Sequence, budget: int) -> Allocation:
  """Group sizes for this step's prompts under a rollout ``budget`` (pure; see module doc).

  Args:
    state: a CERO state.
    problems: [P] Problems or uids.
    budget: total rollouts allowed this step, ``P * g_min <= budget``.
  Returns:
    Allocation with ``g_min <= n_i <= g_max`` and ``Σ n_i <= budget``.
  """
  cfg = state["config"]
  g_min, g_max, P = cfg["g_min"], cfg["g_max"], len(problems)
  budget = int(budget)
  if budget < P * g_min:
    raise ValueError(f"budget {budget} is below P * g_min = {P} * {g_min}")
  vals = prompt_values(state, problems)
  m = marginals(vals["mu"], g_max=g_max, n_sat=cfg["n_sat"])  # [P, G_max] log values
  lam = state["lam"]
  want = np.sum(m >= math.log(lam), axis=1) if lam > 0 else np.full(P, g_max)
  demand = np.clip(want, g_min, g_max).astype(np.int64)
  sizes = demand.copy()
  excess = int(sizes.sum()) - budget
  if excess > 0:  # drop the lowest-value rollouts above g_min (k is 1-based: k > g_min)
    k = np.broadcast_to(np.arange(1, g_max + 1), (P, g_max))
    p_idx, col = np.nonzero((k > g_min) & (k <= sizes[:, None]))
    order = np.lexsort((-p_idx, -col, m[p_idx, col]))  # value asc, then k desc, then slot desc
    np.subtract.at(sizes, p_idx[order[:excess]], 1)
  metrics = {
    "cero/lam": float(state["lam"]),
    "cero/demand": float(demand.sum()),
    "cero/budget": float(budget),
    "cero/allocated": float(sizes.sum()),
    "cero/value_mean": float(vals["v"].mean()) if P else 0.0,
    "cero/group_min": float(sizes.min()) if P else 0.0,
    "cero/group_max": float(sizes.max()) if P else 0.0,
  }
  return Allocation(sizes.astype(np.int32), int(demand.sum()), budget, metrics)


def update(state: dict, problems: Sequence, successes, trials, *, demand: int, budget: int) -> dict:
  """A new state after this step's rollouts were scored (pure).

  Args:
    state: the state :func:`allocate` read.
    problems: [P] Problems or uids, in the allocation's slot order (repeats allowed).
    successes: [P] summed rewards in [0, 1] of each prompt's valid rollouts.
    trials: [P] valid rollouts of each prompt (its realised group size).
    demand, budget: from the step's :class:`Allocation`.
  """
  cfg = state["config"]
  succ = np.asarray(successes, np.float64)
  trials = np.asarray(trials, np.float64)
  if succ.shape != (len(problems),) or trials.shape != succ.shape:
    raise ValueError(f"successes {succ.shape} and trials {trials.shape} must be [{len(problems)}]")
  if np.any(succ < 0) or np.any(succ > trials + 1e-9):
    raise ValueError("need 0 <= successes <= trials")
  new = {**state, "prompts": dict(state["prompts"]), "levels": copy.deepcopy(state["levels"])}
  s, eta = cfg["n_sat"], cfg["lr_prompt"]
  for p, k, n in zip(problems, succ, trials):
    a, b, cum, mu = _entry(new, p)
    a, b, cum = a + float(k), b + float(n - k), cum + float(n)
    v = float(expected_variance(a, b))
    log_target = math.log(v) - cum / s  # ln U'(N): the fixed point
    log_mu = (1.0 - eta) * math.log(max(mu, MU_FLOOR)) + eta * log_target
    mu = math.exp(max(log_mu, math.log(MU_FLOOR)))
    new["prompts"][base.uid_of(p)] = [a, b, cum, min(max(mu, 0.0), v)]
    key = _level_key(p)
    if key is not None:
      old = new["levels"].get(key, [0.0, 0.0])
      new["levels"][key] = [old[0] + float(k), old[1] + float(n)]
  lam = state["lam"] + cfg["lr_budget"] * (demand - budget) / max(budget, 1)
  new["lam"] = max(0.0, float(lam))
  new["steps"] = state["steps"] + 1
  new["spent"] = state["spent"] + int(round(trials.sum()))
  new["budget"] = state["budget"] + int(budget)
  return new


def check_state(state) -> dict:
  """``state`` if it is a CERO state of this version, else a ValueError."""
  if not isinstance(state, dict) or state.get("version") != VERSION:
    raise ValueError(f"not a CERO state of version {VERSION}: {str(state)[:200]}")
  missing = {"config", "lam", "prompts", "levels", "steps", "spent", "budget"} - set(state)
  if missing:
    raise ValueError(f"CERO state lacks {sorted(missing)}")
  if not state["lam"] >= 0:
    raise ValueError(f"CERO state has a negative budget dual {state['lam']}")
  return state


class Cero(base.Scheduler):
  """CERO behind the scheduler protocol.

  ``select`` allocates ``budget = P * group_size`` rollouts (``group_size`` is the mean ``G``
  of the fixed-G baseline it is compared with) and lays the rows out padded (``R = P * g_max``)
  or packed (``R = budget``); ``observe`` updates posteriors and duals from the scored rows.
  """

  name = "cero"

  def __init__(self, *, group_size: int, layout: str = "padded", **config):
    super().__init__(group_size=group_size)
    if layout not in ("padded", "packed"):
      raise ValueError(f"unknown layout {layout!r}; valid: padded, packed")
    self.layout = layout
    self.state = init(**config)
    self.pending = None  # (uids, demand, budget) of the last select

  def select(self, step, problems, rng=None):
    del step, rng  # deterministic given the state
    budget = len(problems) * self.group_size
    alloc = allocate(self.state, problems, budget)
    if self.layout == "padded":
      group, valid = base.padded_layout(alloc.group_sizes, self.state["config"]["g_max"])
    else:
      group, valid = base.packed_layout(alloc.group_sizes, budget)
    self.pending = {
      "uids": [base.uid_of(p) for p in problems],
      "demand": alloc.demand,
      "budget": alloc.budget,
    }
    return base.Selection(list(problems), alloc.group_sizes, group, valid, alloc.metrics)

  def observe(self, step, problems, rewards, group, valid, *, advantages=None):
    del step, advantages
    if self.pending is None or self.pending["uids"] != [base.uid_of(p) for p in problems]:
      raise ValueError("CERO observe() needs the problems of the preceding select(), in order")
    succ, trials = base.group_means(rewards, group, valid, len(problems))
    self.state = update(
      self.state,
      problems,
      succ,
      trials,
      demand=self.pending["demand"],
      budget=self.pending["budget"],
    )
    self.pending = None
    st = self.state
    return {
      "cero/lam": st["lam"],
      "cero/tracked": float(len(st["prompts"])),
      "cero/spent_ratio": st["spent"] / max(st["budget"], 1),
    }

  def state_dict(self):
    return {"meta": {"name": self.name, "cero": self.state, "pending": self.pending}, "arrays": {}}

  def load_state_dict(self, state):
    super().load_state_dict(state)
    self.state = check_state(copy.deepcopy(state["meta"]["cero"]))
    self.pending = copy.deepcopy(state["meta"].get("pending"))
