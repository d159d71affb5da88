"""Rewards (DESIGN.md section 1, the ``rewards`` layer): reward terms, safe reward calls and
their outcomes.

- :mod:`~posttrain_jax.rewards.catalogue`: ``REWARDS``, the registry of reward terms, and
  :func:`resolve` (a name, ``module:function`` or ``file.py:function``).
- :mod:`~posttrain_jax.rewards.terms`: :class:`RewardSet`, a run's reward as the weighted sum
  of ``config.reward.terms`` (the env's verifier is the term ``correct``), each logged.
- :mod:`~posttrain_jax.rewards.calls`: :class:`Scorer` runs ``verify(problem, completion)`` in
  worker processes with a per-call timeout, counts failures by kind, warns once per kind and
  stops a run above an error rate.
- :mod:`~posttrain_jax.rewards.outcomes`: what a call returned, judged (a finite number, or
  ``raised`` / ``timeout`` / ``nonfinite`` / ``non_numeric``), and the ``reward/errors/<kind>``
  metrics.
- :mod:`~posttrain_jax.rewards.math_answers`: the final answer of a free-text completion checked
  against the gold with math-verify (``math``; the static datasets' ``math`` rule).
- :mod:`~posttrain_jax.rewards.formats`: R1-style format rewards (``format``, ``tag_count``)
  and the ``<answer>`` blocks.
- :mod:`~posttrain_jax.rewards.reward_model`: Bradley-Terry reward models (score, loss,
  loading a trained one) and the batched term ``reward_model``.
- :mod:`~posttrain_jax.rewards.cross_model`: CME's reward with a verifier LM of its own
  tokenizer (the term ``cme_text``).
- :mod:`~posttrain_jax.rewards.sandbox`: runs untrusted Python in a separate process under
  bubblewrap (or plain resource limits where it cannot run), with limits and a wall clock.
- :mod:`~posttrain_jax.rewards.rubric`: the rubric + executable constraints + global score
  reward (per-prompt artefacts, checkers in the sandbox, the hybrid; ``rubric``).
- :mod:`~posttrain_jax.rewards.code_tests`: hidden unit tests of generated code, run in the
  sandbox and compared outside it; the ``code_tests`` term.
"""

from posttrain_jax.rewards import (
  code_tests,  # noqa: F401  (registers code_tests)
  cross_model,  # noqa: F401  (registers cme_text)
  formats,  # noqa: F401  (registers format, tag_count)
  math_answers,  # noqa: F401  (registers math)
  outcomes,
  reward_model,  # noqa: F401  (registers reward_model)
  rubric,  # noqa: F401  (registers rubric, rubric_sR/sC/sG)
)
from posttrain_jax.rewards.calls import Scorer
from posttrain_jax.rewards.catalogue import REWARDS, RunInfo, batched, resolve
from posttrain_jax.rewards.terms import RewardSet

__all__ = ["REWARDS", "RewardSet", "RunInfo", "Scorer", "batched", "outcomes", "resolve"]
