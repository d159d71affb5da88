"""The registry of reward terms: ``REWARDS`` maps a name to a function (DESIGN.md section 4).

A run's reward is a weighted sum of terms (``config.reward.terms``, see
:mod:`~posttrain_jax.rewards.terms`); the env's own verifier is the term ``correct``. A term is
one of two kinds:

- a *row* term (the default): ``fn(problem, completion, **kwargs) -> float`` or a mapping of
  named floats (sub-components, summed), called once per completion in the reward worker
  processes with a timeout (:mod:`~posttrain_jax.rewards.calls`); it must be importable
  (module level), since the workers import it by name;
- a *batched* term (tagged with :func:`batched`): ``fn(problems, completions, *, run,
  **kwargs) -> [N] floats``, called once per batch in the run's own process, e.g. a reward
  model scoring on device. ``run`` (:class:`RunInfo`) carries the run's workdir, tokenizer and
  a cache dict the term may keep loaded weights in across batches.

Register a term with ``REWARDS["name"] = fn`` in the module that defines it (this module
is filled by those modules, which ``posttrain_jax.rewards`` imports).
A config may also name a user's function directly: ``"package.module:function"`` or
``"path/to/file.py:function"`` (:func:`resolve`).
"""

import dataclasses
import importlib
import importlib.util
import os
import sys
from typing import Any, Callable

from posttrain_jax.registry import ConfigError

REWARDS: dict[str, Callable] = {}


def batched(fn: Callable) -> Callable:
  """Decorator: ``fn`` is a batched term (called once per batch in the run's process)."""
  fn.batched = True
  return fn


def is_batched(fn: Callable) -> bool:
  return bool(getattr(fn, "batched", False))


@dataclasses.dataclass
class RunInfo:
  """What a batched term may use of the run: its workdir, the policy's tokenizer and a cache
  that lives as long as the run (e.g. loaded reward-model weights)."""

  workdir: str = ""
  tokenizer: Any = None
  cache: dict = dataclasses.field(default_factory=dict)


def _load_file(path: str):
  name = "posttrain_jax_user_rewards_" + os.path.splitext(os.path.basename(path))[0]
  if name in sys.modules and getattr(sys.modules[name], "__file__", None) == path:
    return sys.modules[name]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


def resolve(spec: str, key: str = "config.reward.terms") -> Callable:
  """The function ``spec`` names: a ``REWARDS`` name, ``"module:function"`` or
  ``"path/file.py:function"``; a ConfigError naming ``key`` and the fix otherwise."""
  if ":" not in spec:
    if spec not in REWARDS:
      raise ConfigError(
        f"{key}: unknown reward {spec!r}; valid reward names: "
        f"{', '.join(sorted(REWARDS))}, or 'package.module:function', or "
        "'path/to/file.py:function'"
      )
    return REWARDS[spec]
  return import_function(spec, key)


def import_function(spec: str, key: str, kind: str = "reward") -> Callable:
  """The module-level function ``spec`` names, ``"module:function"`` or
  ``"path/file.py:function"``; a ConfigError naming ``key``, ``kind`` and the fix otherwise."""
  where, _, attr = spec.rpartition(":")
  try:
    if where.endswith(".py"):
      path = os.path.abspath(where)
      if not os.path.exists(path):
        raise ConfigError(f"{key}: {kind} file {where!r} does not exist (from {spec!r})")
      module = _load_file(path)
    else:
      module = importlib.import_module(where)
  except ConfigError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    raise ConfigError(
      f"{key}: cannot import the {kind} {spec!r}: {type(e).__name__}: {e}"
    ) from None
  fn = getattr(module, attr, None)
  if not callable(fn):
    raise ConfigError(
      f"{key}: {where!r} has no function {attr!r} (from {spec!r}); name a "
      "module-level function as 'module:function' or 'file.py:function'"
    )
  return fn
