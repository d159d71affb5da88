"""The ranges of the config's numeric keys and the settings that have no effect.

:data:`NUMERIC_KEYS` gives every numeric key declared in ``train/config_fields/`` its kind of :data:`KINDS`
(a positive count, a fraction ...); :func:`check_numbers` refuses a value outside it with a
ConfigError naming the key. :data:`UNUSED_WHEN` lists keys another setting switches off;
:func:`warn_unused` prints a key set away from its default there once, as ``warning: ...``.
"""

import sys

from posttrain_jax import fields
from posttrain_jax.registry import ConfigError
from posttrain_jax.train import config_fields, defaults


def _require(cond: bool, msg: str) -> None:
  if not cond:
    raise ConfigError(msg)


KINDS = fields.KINDS  # a numeric key's kind: (test, requirement, a value it refuses)

# Every numeric key and its kind, from the declarations (train/config_fields/; tests/faults/
# test_faults_errors.py checks it covers them all; model.causal_block and distributed.* are
# checked below).
NUMERIC_KEYS = {key: k.kind for key, k in config_fields.KEYS.items() if k.kind}


def _lookup(config, key: str):
  """``config[a][b]...`` for ``key`` = 'a.b...'; KeyError when a section is None (off)."""
  node = config
  for part in key.split("."):
    if node is None:
      raise KeyError(key)
    node = node[part]
  return node


def check_numbers(config) -> None:
  """Every key of :data:`NUMERIC_KEYS` holds a number of its kind (``rl.norm_length``: None
  or a positive integer)."""
  for key, kind in NUMERIC_KEYS.items():
    ok, need, _ = KINDS[kind]
    try:
      value = _lookup(config, key)
    except KeyError:
      continue  # a section switched off (e.g. rl.curriculum=None)
    _require(ok(value), f"config.{key} must be {need}, got {value!r}")
  norm = config.rl.norm_length
  _require(
    norm is None or KINDS["count"][0](norm),
    f"config.rl.norm_length must be None (the max_new_tokens budget) or a positive "
    f"integer, got {norm!r}",
  )


# Keys that have no effect unless another setting selects them, (keys, is unused, why): each
# rule is declared by the section that owns its keys (``Section.unused``, train/config_fields/).
UNUSED_WHEN = tuple(
  rule for section in fields.sections(config_fields.ROOT).values() for rule in section.unused
)
_warned = set()


def _plain(value):
  """A section as a plain dict (two ConfigDicts with the same items may compare unequal)."""
  return value.to_dict() if hasattr(value, "to_dict") else value


def unused_settings(config) -> list[str]:
  """One line per key set away from its default that has no effect under the rest of
  ``config`` (:data:`UNUSED_WHEN`)."""
  base = defaults.base_config()
  out = []
  for keys, unused, why in UNUSED_WHEN:
    if not unused(config):
      continue
    for key in keys:
      try:
        value = _lookup(config, key)
      except KeyError:
        continue
      if _plain(value) != _plain(_lookup(base, key)):
        out.append(f"config.{key}={value!r} has no effect: {why}")
  return out


def warn_unused(config) -> None:
  """Prints each of :func:`unused_settings` once per process, as ``warning: ...`` on stderr."""
  for line in unused_settings(config):
    if line not in _warned:
      _warned.add(line)
      print(f"warning: {line}", file=sys.stderr, flush=True)
