"""Which prompts, how many rollouts each, and which stored rollouts to train on again.

Host-side logic only (numpy, JSON-safe state); it imports ``envs``, ``rollout`` and
``objectives`` but never ``train``. ``SCHEDULERS`` maps a config name to a factory::

    scheduler = SCHEDULERS[name](group_size=G, **kwargs)     # or make(name, group_size=G, ...)

=================  ===========================================================================
name               what it does
=================  ===========================================================================
none, uniform      ``G`` rollouts for every candidate prompt (GRPO's batch, today's behaviour)
cero               CERO (arXiv 2606.05606): Beta-posterior value, per-prompt group sizes in
                   ``[g_min, g_max]`` with ``Σ n_i <= P * G`` (:mod:`.cero`)
rollout_replay     uniform prompts + rollout-level |A|-prioritised, age-capped, fresh-anchored
                   replay (arXiv 2606.04560; :mod:`.replay`)
group_replay       uniform prompts + naive whole-group uniform replay (the baseline arm)
review             retention-aware review (arXiv 2606.03087): a share ``rho`` of each batch is
                   replaced, before rollout, by mastered prompts inside the repair window
uniform_review     the same share replaced by uniformly drawn past prompts (baseline arm)
=================  ===========================================================================

The protocol: what a trainer calls, and when (DESIGN.md section 3). ``P`` prompts, ``R`` rows::

    # step 1, before generation: prompts and their rows
    sel = scheduler.select(step, candidates, rng)         # Selection
    #   sel.problems [P]  (P = len(candidates); review may swap some, never the count)
    #   sel.group_sizes [P] int32, sel.group [R] int32, sel.valid [R] float32
    #   row r is a rollout of sel.problems[sel.group[r]]; rows with valid 0 are padding.
    #   R is static per scheduler: P*G (uniform/replay/review), P*g_max (cero, padded layout)
    #   or P*G (cero, layout='packed'). Generate all R rows; set Rollout.group = sel.group.
    # steps 2-5: generate, score -> rewards [R]; advantages with
    #   AdvantageInputs(rewards, group=sel.group, valid=sel.valid), num_groups=P
    # step 6, before the update: the train rows (replay schedulers append stored rollouts)
    out = scheduler.compose(step, rows, rng, uids=sel.row_uids())   # Composed
    #   rows: host numpy dict, replay.rows_from_rollout(host_rollout, advantages=adv,
    #         rewards=rewards, valid=sel.valid); out.rows has R+M rows (M static) plus
    #         'is_replay' and 'age'. Train on out.rows: recompute trainer/reference log-probs on
    #         its tokens, keep its stored 'advantages' and behaviour 'logprobs', weight by
    #         'valid'. Non-replay schedulers return the rows unchanged (M = 0).
    # step 9, after scoring (any time before the next select):
    metrics = scheduler.observe(step, sel.problems, rewards, sel.group, sel.valid,
                                advantages=adv)         # flat '/'-namespaced floats
    # step 10, checkpoint: everything a resumed run needs
    st = scheduler.state_dict()   # {'meta': JSON-safe dict, 'arrays': nested numpy dict}
    scheduler.load_state_dict(st) # on resume, before the next select

Keyword arguments of each factory besides ``group_size`` (defaults in the modules):
``cero``: ``layout`` ('padded' | 'packed'), ``g_min, g_max, a0, b0, n_sat, lr_budget, lr_prompt,
lam0, level_prior``; ``rollout_replay``: ``tau_max, replay_count | replay_fraction, alpha,
max_replays, zero_tol, state_rows``; ``group_replay``: ``tau_max (None), replay_count |
replay_fraction, capacity, state_rows``; ``review`` / ``uniform_review``: ``rho, d_min, d_max,
tau, pool_size, epoch_steps`` (0: the trainer calls ``scheduler.close_epoch(step)`` itself).
After ``observe``, a scheduler with ``logs_events`` (review) returns from ``events()`` the visit
events to append to a log for ``review.restoration_episodes`` / ``review.repair_curve`` (the
repair-window measurement).
CERO's and review's meta grow by one small entry per prompt ever seen.

``rng`` is a numpy Generator or a JAX key; pass ``fold_in(key, step)``-derived keys so a resumed
run draws the same numbers. ``select``/``compose`` must see the same ``step`` as the matching
``observe``. All inputs are host arrays (fetch sharded ones with ``parallel.to_host`` first).
Each module also exposes its pure functions (``cero.allocate/update``, ``review.replace/observe
/close_epoch``, ``replay.RolloutReplay``) for use without the protocol.
"""

from posttrain_jax.registry import lookup
from posttrain_jax.scheduling import cero, replay, review
from posttrain_jax.scheduling.base import (
  Composed,
  Scheduler,
  Selection,
  Uniform,
  as_generator,
  group_means,
  packed_layout,
  padded_layout,
  uniform_selection,
)
from posttrain_jax.scheduling.cero import Cero
from posttrain_jax.scheduling.replay import (
  BUFFERS,
  GroupReplay,
  Replay,
  RolloutReplay,
  rollout_from_rows,
  rows_from_rollout,
)
from posttrain_jax.scheduling.review import Review, repair_curve, restoration_episodes, turnover


def _replay(buffer):
  return lambda *, group_size, **kw: Replay(group_size=group_size, buffer=buffer, **kw)


def _review(mode):
  return lambda *, group_size, **kw: Review(group_size=group_size, mode=mode, **kw)


SCHEDULERS = {
  "none": Uniform,
  "uniform": Uniform,
  "cero": Cero,
  "rollout_replay": _replay("rollout"),
  "group_replay": _replay("group"),
  "review": _review("review"),
  "uniform_review": _review("uniform"),
}


def make(name: str, *, group_size: int, **kwargs) -> Scheduler:
  """``SCHEDULERS[name](group_size=..., **kwargs)``; an unknown name lists the valid ones."""
  return lookup(SCHEDULERS, name, "scheduler")(group_size=group_size, **kwargs)


__all__ = [
  "BUFFERS",
  "Cero",
  "Composed",
  "GroupReplay",
  "Replay",
  "Review",
  "RolloutReplay",
  "SCHEDULERS",
  "Scheduler",
  "Selection",
  "Uniform",
  "as_generator",
  "cero",
  "group_means",
  "make",
  "packed_layout",
  "padded_layout",
  "repair_curve",
  "replay",
  "restoration_episodes",
  "review",
  "rollout_from_rows",
  "rows_from_rollout",
  "turnover",
  "uniform_selection",
]
