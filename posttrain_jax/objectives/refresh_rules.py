"""When and how far a copy of the policy moves toward it: the refresh rules of a teacher's copy
(``config.rl.teacher.rule``) and of the reference (``config.rl.ref_rule``; DESIGN.md section 4,
``REFRESH_RULES``). The docs below say "teacher" for the copy.

A rule is a pure host-side function, called once after every RL update::

    mix, state, metrics = REFRESH_RULES[name](state, stats, step, **rule_kwargs)

- ``state``: the rule's JSON-serialisable dict (:func:`init_state` gives the first one; the run
  stores it in the checkpoint meta, so a resumed run makes the same decisions);
- ``stats``: the step's record of floats; the rules read ``reward/mean``, ``gen/len_p95``,
  ``gen/truncated`` (fraction of rollouts that hit ``max_new_tokens``) and, when present,
  ``teacher/kl`` (the KL student || teacher measured on this step's rollouts);
- ``step``: the number of RL updates done (1 after the first);
- ``mix`` in [0, 1]: the teacher then becomes ``(1 - mix) * teacher + mix * student``
  (:func:`blend`). ``mix == 0`` leaves it untouched (bit-identical), ``mix == 1`` is a snapshot.

Rules:

- ``never``: the teacher stays as it started.
- ``every``: every ``period`` updates, ``mix = alpha``. ``alpha = 1`` is a snapshot refresh;
  ``alpha < 1`` is TRL's ``sync_ref_model`` (from TR-DPO, Gorbatovski et al. 2024), whose
  docs write ``π_ref = α * π_θ + (1 - α) * π_ref_prev`` every ``ref_model_sync_steps`` steps,
  with ``global_step % ref_model_sync_steps == 0`` after an optimizer step
  (``ref_model_mixup_alpha`` = our ``alpha``, ``ref_model_sync_steps`` = our ``period``).
- ``ema``: every update ``θ_T <- α θ_T + (1 - α) θ_S``, i.e. ``mix = 1 - alpha`` (note the
  convention: here ``alpha`` weighs the *teacher*, as μ of Feedback Distillation's EMA
  teacher; research/methods_B.md section 7 sets μ = 0.99, the notes' own choice).
- ``cgtr``: CGTR's consolidation gate (arXiv 2606.03532; research/methods_A.md section 9; the
  gate formulas there are *derived*, not read in the paper), see :func:`cgtr`.

Every rule's metrics hold ``teacher/refreshes`` (count so far), ``teacher/refreshed`` (1.0 on a
step with ``mix > 0``) and ``teacher/steps_since_refresh`` (updates since the last step with
``mix > 0``, or since the start, counted before this step's decision).
"""

import inspect
import math
from typing import Callable

import jax
import jax.numpy as jnp

from posttrain_jax import registry

KEY = "config.rl.teacher.rule_kwargs"  # where a rule's kwargs live in the config


# ---------------------------------------------------------------- shared bookkeeping


def _finish(mix: float, state: dict, step: int, metrics: dict) -> tuple[float, dict, dict]:
  """Counts a refresh (``mix > 0``) and adds the metrics every rule logs."""
  since = step - state["last_refresh"]
  if mix > 0:
    state = {**state, "refreshes": state["refreshes"] + 1, "last_refresh": step}
  metrics = {
    **metrics,
    "teacher/refreshes": float(state["refreshes"]),
    "teacher/refreshed": float(mix > 0),
    "teacher/steps_since_refresh": float(since),
  }
  return float(mix), state, metrics


def _stat(stats: dict, key: str) -> float:
  if key not in stats:
    raise KeyError(
      f"teacher rule needs the step statistic {key!r}, absent from this step's "
      f"record (present: {', '.join(sorted(stats))})"
    )
  value = float(stats[key])
  if not math.isfinite(value):
    raise ValueError(f"teacher rule got a non-finite step statistic {key}={value}")
  return value


# ---------------------------------------------------------------- the rules


def never(state: dict, stats: dict, step: int) -> tuple[float, dict, dict]:
  """The teacher is never moved (a frozen teacher: the RL start, or a loaded checkpoint)."""
  del stats
  return _finish(0.0, state, step, {})


def every(
  state: dict, stats: dict, step: int, *, period: int = 10, alpha: float = 1.0
) -> tuple[float, dict, dict]:
  """A refresh every ``period`` updates (steps ``period, 2 period, ...``) with ``mix = alpha``:

      θ_T <- α θ_S + (1 - α) θ_T   if step % period == 0,   else θ_T unchanged.

  ``alpha = 1``: a snapshot (CGTR's fixed-M baseline). ``alpha < 1``: TRL's ``sync_ref_model``
  with ``ref_model_mixup_alpha = alpha`` and ``ref_model_sync_steps = period`` (TR-DPO).
  """
  del stats
  mix = alpha if step > 0 and step % period == 0 else 0.0
  return _finish(mix, state, step, {})


def ema(state: dict, stats: dict, step: int, *, alpha: float = 0.99) -> tuple[float, dict, dict]:
  """An exponential moving average of the student, updated after every step:

      θ_T <- α θ_T + (1 - α) θ_S,   so   mix = 1 - α,

  and after n steps from θ_T = θ_0 against a fixed θ_S the teacher is
  ``α^n θ_0 + (1 - α^n) θ_S``. Feedback Distillation's teacher: μ = α = 0.99 (methods_B.md
  section 7, the notes' choice); CGTR's baselines: α ∈ {0.9, 0.99}. ``alpha = 0`` copies the
  student every step.
  """
  del stats
  return _finish(1.0 - alpha, state, step, {})


def _ema_update(old: float | None, x: float, window: float) -> float:
  """``(1 - 1/W) old + (1/W) x``, started at the first value seen (no bias correction)."""
  return x if old is None else (1.0 - 1.0 / window) * old + x / window


def cgtr(
  state: dict,
  stats: dict,
  step: int,
  *,
  window: float = 10.0,
  min_isolation: int = 10,
  delta_r: float = 0.01,
  delta_l: float = 0.1,
  max_truncation: float = 0.05,
) -> tuple[float, dict, dict]:
  """CGTR's consolidation gate (arXiv 2606.03532, "Consolidation-Gated Teacher Refresh";
  research/methods_A.md section 9, gate formulas *derived*). The teacher stays frozen
  (isolation) and is replaced by the student (``mix = 1``) after step t iff all of:

      (1) t - t_last >= M_min                                        (isolation)
      (2) R̄_t >= R̄_{t_last} + δ_R                                   (reward improved)
      (3) q̄95_t <= (1 + δ_L) q̄95_{t_last}   and   τ̄_t <= τ_trunc     (length tail safe)

  where R̄, q̄95, τ̄ are EMAs over a window W of ``reward/mean``, ``gen/len_p95`` and
  ``gen/truncated``: ``x̄_t = (1 - 1/W) x̄_{t-1} + x_t / W``, started at the first value (so
  W = 10 is the notes' "window of about 10 steps"). ``t_last`` is the last refresh (0 at the
  start: the teacher is the RL start), and the values "at the last refresh" are the EMAs at
  that step; before any refresh they are the first statistics seen, so (2) asks the reward to
  rise by δ_R above where the run started. The gate is evaluated on the EMAs updated with
  step t's statistics.

  τ_trunc = 0.05 by default: it matches the quantile of (3). Once more than 5% of rollouts hit
  the budget the p95 sits at ``max_new_tokens`` and cannot grow further, so the relative test
  on q95 goes blind exactly when the tail reaches the budget; the truncation test covers that.
  A run that starts with more than 5% truncation never refreshes (``teacher/gate_length`` 0).

  Args (kwargs, ``config.rl.teacher.rule_kwargs``): window W >= 1; min_isolation M_min >= 1
  (10); delta_r δ_R (0.01, in reward units); delta_l δ_L >= 0 (0.1); max_truncation τ_trunc
  in [0, 1].

  Metrics: ``teacher/gate_isolation``, ``teacher/gate_reward``, ``teacher/gate_length`` (0/1,
  the conditions tested this step), ``teacher/reward_ema``, ``teacher/len_p95_ema``,
  ``teacher/truncation_ema``, and on a refresh step ``teacher/refresh_shock``: the step's
  ``teacher/kl`` (the KL student || teacher just before the refresh), when the record has it.
  """
  reward = _ema_update(state["reward_ema"], _stat(stats, "reward/mean"), window)
  len95 = _ema_update(state["len_p95_ema"], _stat(stats, "gen/len_p95"), window)
  trunc = _ema_update(state["truncation_ema"], _stat(stats, "gen/truncated"), window)
  state = {**state, "reward_ema": reward, "len_p95_ema": len95, "truncation_ema": trunc}
  if state["reward_at_refresh"] is None:  # the first step: the start is the last "refresh"
    state = {**state, "reward_at_refresh": reward, "len_p95_at_refresh": len95}
  gate_isolation = step - state["last_refresh"] >= min_isolation
  gate_reward = reward >= state["reward_at_refresh"] + delta_r
  gate_length = len95 <= (1.0 + delta_l) * state["len_p95_at_refresh"] and trunc <= max_truncation
  metrics = {
    "teacher/gate_isolation": float(gate_isolation),
    "teacher/gate_reward": float(gate_reward),
    "teacher/gate_length": float(gate_length),
    "teacher/reward_ema": reward,
    "teacher/len_p95_ema": len95,
    "teacher/truncation_ema": trunc,
  }
  refresh = gate_isolation and gate_reward and gate_length
  if refresh:
    state = {**state, "reward_at_refresh": reward, "len_p95_at_refresh": len95}
    if "teacher/kl" in stats:
      metrics["teacher/refresh_shock"] = float(stats["teacher/kl"])
  return _finish(1.0 if refresh else 0.0, state, step, metrics)


REFRESH_RULES: dict[str, Callable] = {
  "never": never,
  "every": every,
  "ema": ema,
  "cgtr": cgtr,
}

# ---------------------------------------------------------------- config checks and state


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v) -> bool:
  return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


# rule -> kwarg -> (test, what the value must be)
_RANGES: dict[str, dict[str, tuple[Callable, str]]] = {
  "every": {
    "period": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "alpha": (lambda v: _is_real(v) and 0 < v <= 1, "a number in (0, 1]"),
  },
  "ema": {"alpha": (lambda v: _is_real(v) and 0 <= v < 1, "a number in [0, 1)")},
  "cgtr": {
    "window": (lambda v: _is_real(v) and v >= 1, "a number >= 1"),
    "min_isolation": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "delta_r": (_is_real, "a finite number"),
    "delta_l": (lambda v: _is_real(v) and v >= 0, "a number >= 0"),
    "max_truncation": (lambda v: _is_real(v) and 0 <= v <= 1, "a number in [0, 1]"),
  },
}


def lookup(name: str) -> Callable:
  """``REFRESH_RULES[name]``, or a ConfigError listing the valid names."""
  return registry.lookup(REFRESH_RULES, name, "teacher rule (config.rl.teacher.rule)")


def accepted(name: str) -> tuple[str, ...]:
  """The kwargs rule ``name`` takes."""
  params = inspect.signature(lookup(name)).parameters.values()
  return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


def check(name: str, kwargs: dict, *, key: str = KEY) -> None:
  """Raises ConfigError if ``name`` is no rule, or ``kwargs`` holds an unknown key or a value
  out of range; the message names the config key (``key.<name>``, by default
  ``config.rl.teacher.rule_kwargs.<name>``)."""
  keys = accepted(name)
  bad = sorted(set(kwargs) - set(keys))
  if bad:
    takes = ", ".join(keys) if keys else "no arguments"
    raise registry.ConfigError(
      f"{key} has unknown argument(s) {bad} for teacher rule {name!r}; it takes: {takes}"
    )
  for arg, value in kwargs.items():
    test, want = _RANGES[name][arg]
    if not test(value):
      raise registry.ConfigError(f"{key}.{arg}={value!r} must be {want} (teacher rule {name!r})")


LORA_MESSAGE = (
  "a refreshed teacher or reference copies the full policy; with config.rl.lora the "
  "policy state holds only the adapters: set the rules to 'never' or config.rl.lora.rank=0"
)


def check_setting(key: str, name: str, kwargs: dict) -> None:
  """ConfigError unless ``name`` (config key ``key``, e.g. ``config.rl.ref_rule``) is a rule and
  ``kwargs`` (``{key}_kwargs``) are its arguments in range."""
  if name not in REFRESH_RULES:
    raise registry.ConfigError(
      f"{key}={name!r} is unknown; valid rules: {', '.join(sorted(REFRESH_RULES))}"
    )
  check(name, kwargs, key=f"{key}_kwargs")


def init_state(name: str, **kwargs) -> dict:
  """Rule ``name``'s starting state (kwargs checked by :func:`check`): refreshes 0, the last
  refresh at step 0 (the start), and for ``cgtr`` its EMAs and values at the last refresh,
  None until the first statistics arrive."""
  check(name, kwargs)
  state = {"refreshes": 0, "last_refresh": 0}
  if name == "cgtr":
    state.update(
      reward_ema=None,
      len_p95_ema=None,
      truncation_ema=None,
      reward_at_refresh=None,
      len_p95_at_refresh=None,
    )
  return state


# ---------------------------------------------------------------- the parameter update


def blend(teacher, student, mix: float):
  """``(1 - mix) * teacher + mix * student`` leaf by leaf, computed in float32 and cast to each
  teacher leaf's dtype (an EMA kept in bf16 arithmetic would lose the small steps).
  ``mix == 0`` returns ``teacher`` itself (bit-identical, nothing computed); ``mix == 1``
  fresh copies of the student's leaves (never aliases, so a donated student buffer cannot
  take the teacher with it). Both trees must have the same structure and shapes: only a
  teacher built from the policy can be refreshed from it."""
  if not 0.0 <= mix <= 1.0:
    raise ValueError(f"blend: mix must lie in [0, 1], got {mix}")
  if mix == 0.0:
    return teacher
  t_leaves, t_def = jax.tree.flatten(teacher)
  s_leaves, s_def = jax.tree.flatten(student)
  if t_def != s_def or any(jnp.shape(t) != jnp.shape(s) for t, s in zip(t_leaves, s_leaves)):
    raise registry.ConfigError(
      "config.rl.teacher.rule moves the teacher toward the student, but the teacher's "
      "parameters do not have the student's structure and shapes (a teacher of another "
      "preset or checkpoint); use rule 'never' for such a teacher"
    )
  if mix == 1.0:
    out = [jnp.array(s, dtype=jnp.result_type(t), copy=True) for t, s in zip(t_leaves, s_leaves)]
  else:
    out = [
      ((1.0 - mix) * jnp.asarray(t, jnp.float32) + mix * jnp.asarray(s, jnp.float32)).astype(
        jnp.result_type(t)
      )
      for t, s in zip(t_leaves, s_leaves)
    ]
  return jax.tree.unflatten(t_def, out)
