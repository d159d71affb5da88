"""The ranges of the config's numeric keys and the settings that have no effect.

:func:`numeric_keys` gives every numeric key of a declaration its kind of :data:`KINDS`
(a positive count, a fraction ...); :func:`check_numbers` refuses a value outside it with a
ConfigError naming the key. :func:`unused_rules` lists keys another setting switches off;
:func:`warn_unused` prints a key set away from its default there once, as ``warning: ...``.
"""

import sys

from posttrain_jax import fields
from posttrain_jax.registry import ConfigError
from posttrain_jax.train import config_fields, configs


def _require(cond: bool, msg: str) -> None:
  if not cond:
    raise ConfigError(msg)


KINDS = fields.KINDS  # a numeric key's kind: (test, requirement, a value it refuses)


def numeric_keys(root=None) -> dict:
  """Every numeric key of the declaration ``root`` (default the engine's, train/config_fields/;
  ``train.hooks.config_root(methods)`` adds the methods') and its kind."""
  keys = config_fields.KEYS if root is None else fields.flatten(root)
  return {key: k.kind for key, k in keys.items() if k.kind}


def unused_rules(root=None) -> tuple:
  """The declaration's rules of keys another setting switches off, ``(keys, is unused, why)``:
  each declared by the section that owns its keys (``Section.unused``)."""
  root = config_fields.ROOT if root is None else root
  return tuple(rule for section in fields.sections(root).values() for rule in section.unused)


def _lookup(config, key: str):
  """``config[a][b]...`` for ``key`` = 'a.b...'; KeyError when a section is None (off)."""
  node = config
  for part in key.split("."):
    if node is None:
      raise KeyError(key)
    node = node[part]
  return node


def check_numbers(config, root=None) -> None:
  """Every numeric key of ``root`` (:func:`numeric_keys`) holds a number of its kind
  (``rl.norm_length``: None or a positive integer)."""
  for key, kind in numeric_keys(root).items():
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


_warned = set()


def _plain(value):
  """A section as a plain dict (two ConfigDicts with the same items may compare unequal)."""
  return value.to_dict() if hasattr(value, "to_dict") else value


def unused_settings(config, root=None) -> list[str]:
  """One line per key set away from its default that has no effect under the rest of
  ``config`` (:func:`unused_rules` of ``root``)."""
  base = configs.base_config(root)
  out = []
  for keys, unused, why in unused_rules(root):
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


def warn_unused(config, root=None) -> None:
  """Prints each of :func:`unused_settings` once per process, as ``warning: ...`` on stderr."""
  for line in unused_settings(config, root):
    if line not in _warned:
      _warned.add(line)
      print(f"warning: {line}", file=sys.stderr, flush=True)
