"""Config fields declared once: a key's default, doc, numeric kind, the first stage a change to it
reruns, and whether a change reruns anything, beside each other in its section.

A section is a :class:`Section` of :class:`Field` entries and nested sections::

    PRETRAIN = Section(
      "next-token training on the env's generated corpus",
      stage="pretrain",
      fields=dict(
        steps=Field(600, "pretraining steps", kind="count0"),
        lr=Field(1e-3, "peak learning rate", kind="positive"),
      ),
    )

Everything else is derived from the declarations (:func:`to_config`, :func:`flatten`): the
default config (``posttrain_jax.defaults.base_config``), the ranges ``config_ranges`` checks, the
rerun table of ``train/workdir.py`` and the key table of docs/config.md. A leaf module: it
imports nothing of the package.
"""

import dataclasses
import math
from typing import Any, NamedTuple

import ml_collections
import numpy as np


def _is_int(v) -> bool:
  return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_real(v) -> bool:
  return isinstance(v, (int, float, np.number)) and not isinstance(v, bool)


# Kinds of numeric key: (test, the requirement as the message states it, a value it refuses).
KINDS = {
  "count": (lambda v: _is_int(v) and v >= 1, "a positive integer", 0),
  "count0": (lambda v: _is_int(v) and v >= 0, "an integer >= 0", -1),
  "finite": (lambda v: _is_real(v) and math.isfinite(v), "a finite number", float("nan")),
  "positive": (lambda v: _is_real(v) and v > 0, "a number > 0", 0.0),
  "nonneg": (lambda v: _is_real(v) and v >= 0, "a number >= 0", -1.0),
  "fraction": (lambda v: _is_real(v) and 0 <= v <= 1, "a number in [0, 1]", 1.5),
  "prob": (lambda v: _is_real(v) and 0 < v <= 1, "a number in (0, 1]", 0.0),
  "decay": (lambda v: _is_real(v) and 0 <= v < 1, "a number in [0, 1)", 1.0),
  "open": (lambda v: _is_real(v) and 0 < v < 1, "a number in (0, 1)", 1.0),
}


@dataclasses.dataclass(frozen=True)
class Field:
  """One key. ``kind``: a :data:`KINDS` name for a numeric key ('' none); ``stage``: the first
  kind of stage a change reruns ('' its section's); ``rerun``: False for a key that changes no
  result (display, caches, placement); ``typed``: the type of a ``None`` default (an
  ``ml_collections.FieldReference``)."""

  default: Any
  doc: str = ""
  kind: str = ""
  stage: str = ""
  rerun: bool | None = None
  typed: type | None = None

  def __post_init__(self):
    if self.kind and self.kind not in KINDS:
      raise ValueError(f"unknown kind {self.kind!r}; kinds: {', '.join(KINDS)}")


@dataclasses.dataclass(frozen=True)
class Section:
  """A config section: ``fields`` maps names to :class:`Field` or nested sections. ``stage`` and
  ``rerun`` are its fields' defaults; ``free`` marks a section of free-form keys (a piece's
  keyword arguments, named terms) whose default is ``{}`` and which an arm replaces whole;
  ``unused``: the section's rules of keys another setting switches off, ``(keys, when(config),
  why)`` (``config_ranges.warn_unused``)."""

  doc: str = ""
  fields: dict = dataclasses.field(default_factory=dict)
  stage: str = ""
  rerun: bool | None = None
  free: bool = False
  unused: tuple = ()


def free(doc: str, **kwargs) -> Section:
  """A section of free-form keys (default ``{}``)."""
  return Section(doc, free=True, **kwargs)


class Key(NamedTuple):
  """One leaf of the flattened declarations: a field, or a free-form section (a ``{}`` leaf),
  with its inherited stage and rerun flag resolved."""

  name: str
  default: Any
  doc: str
  kind: str
  stage: str
  rerun: bool
  free: bool


def to_config(section: Section) -> ml_collections.ConfigDict:
  """The ConfigDict of ``section``'s defaults (copies: a caller may change it)."""
  out = ml_collections.ConfigDict()
  for name, item in section.fields.items():
    if isinstance(item, Section):
      out[name] = ml_collections.ConfigDict() if item.free else to_config(item)
    elif item.typed is not None:
      out[name] = ml_collections.FieldReference(item.default, field_type=item.typed)
    else:
      out[name] = _copy(item.default)
  return out


def _copy(value):
  if isinstance(value, (list, dict)):
    return type(value)(value)
  return value


def flatten(section: Section, prefix: str = "", stage: str = "", rerun: bool = True) -> dict:
  """``{"rl.lr": Key, ...}``: every field and free-form section of ``section``, in order."""
  stage, rerun = section.stage or stage, rerun if section.rerun is None else section.rerun
  out = {}
  for name, item in section.fields.items():
    key = prefix + name
    if isinstance(item, Section) and not item.free:
      out.update(flatten(item, key + ".", stage, rerun))
    elif isinstance(item, Section):
      own = rerun if item.rerun is None else item.rerun
      out[key] = Key(key, {}, item.doc, "", item.stage or stage, own, True)
    else:
      own = rerun if item.rerun is None else item.rerun
      out[key] = Key(key, item.default, item.doc, item.kind, item.stage or stage, own, False)
  return out


def sections(section: Section, prefix: str = "") -> dict:
  """``{"rl.dcmdp": Section, ...}``: every section (``""`` the root), for their ``unused``
  rules and docs."""
  out = {prefix.rstrip("."): section}
  for name, item in section.fields.items():
    if isinstance(item, Section) and not item.free:
      out.update(sections(item, prefix + name + "."))
  return out


def free_form(section: Section, prefix: str = "") -> tuple:
  """The dotted names of ``section``'s free-form sections."""
  return tuple(k for k, v in flatten(section, prefix).items() if v.free)


def merge(root: Section, additions: dict) -> Section:
  """``root`` with each of ``additions`` (``{"rl.save": Section}``) placed at its dotted path: a
  method declares its section in its folder and the config is the engine's sections plus the
  methods'. ValueError when a parent is missing or the name is taken."""
  out = root
  for path, section in additions.items():
    *parents, name = path.split(".")
    out = _insert(out, parents, name, section, path)
  return out


def _insert(node: Section, parents: list, name: str, section: Section, path: str) -> Section:
  if not parents:
    if name in node.fields:
      raise ValueError(f"config section {path!r} is declared twice")
    return dataclasses.replace(node, fields={**node.fields, name: section})
  head, rest = parents[0], parents[1:]
  child = node.fields.get(head)
  if not isinstance(child, Section) or child.free:
    raise ValueError(f"config section {path!r}: there is no section {head!r} to hold it")
  return dataclasses.replace(
    node, fields={**node.fields, head: _insert(child, rest, name, section, path)}
  )
