"""The config's declarations (posttrain_jax/fields.py, train/config_fields/): the default config,
the ranges and the rerun table are derived from them, and the declarations are consistent."""

import ml_collections
import pytest

from posttrain_jax import fields
from posttrain_jax.train import config_fields, config_ranges, defaults, workdir
from posttrain_jax.train import stages as stages_lib


def test_every_default_lies_in_its_declared_range():
  for key, k in config_fields.KEYS.items():
    if k.kind:
      test, want, refused = fields.KINDS[k.kind]
      assert test(k.default), f"{key}={k.default!r} is not {want}"
      assert not test(refused)


def test_every_key_has_a_doc_and_a_stage_of_the_table():
  for key, k in config_fields.KEYS.items():
    assert k.doc.strip(), key
    assert k.stage in stages_lib.STAGES, (key, k.stage)


def _leaves(c, prefix=""):
  out = {}
  for key in c.keys():
    value = c[key]
    if isinstance(value, ml_collections.ConfigDict) and len(value.keys()):
      out.update(_leaves(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def test_the_default_config_is_the_declarations():
  base = _leaves(defaults.base_config())
  assert set(base) == set(config_fields.KEYS)
  for key, k in config_fields.KEYS.items():
    want = {} if k.free else k.default
    got = base[key].to_dict() if isinstance(base[key], ml_collections.ConfigDict) else base[key]
    assert got == want, key
  assert defaults.base_config().rl.get_ref("norm_length").get_type() is int  # a typed None


def test_the_range_table_is_the_declared_kinds():
  assert config_ranges.NUMERIC_KEYS == {
    key: k.kind for key, k in config_fields.KEYS.items() if k.kind
  }
  assert config_ranges.NUMERIC_KEYS["rl.lr"] == "positive"


@pytest.mark.parametrize(
  "key,stage,reruns",
  [
    ("rl.lr", "rl", True),
    ("rl.max_new_tokens", "pretrain", True),  # pretraining's sequence length
    ("eval.pass_n", "eval", True),
    ("eval.seed", "pretrain", True),
    ("rl.teacher.preset", "teacher", True),
    ("rl.checkpoint_every", "rl", False),
    ("mesh.shape", "pretrain", False),
    ("rl.advantage_kwargs.eps", "rl", True),  # inside a free-form section: the section's
  ],
)
def test_the_rerun_table_reads_the_declarations(key, stage, reruns):
  declared = workdir._declared(key)  # pylint: disable=protected-access
  assert declared.stage == stage
  assert workdir._ignored(key) is (not reruns)  # pylint: disable=protected-access


def test_a_declaration_with_an_unknown_kind_is_refused():
  with pytest.raises(ValueError, match="unknown kind 'countt'"):
    fields.Field(1, "x", kind="countt")


def test_every_unused_rule_lives_in_the_section_that_owns_its_keys():
  rules = 0
  for name, section in fields.sections(config_fields.ROOT).items():
    for keys, when, why in section.unused:
      rules += 1
      assert callable(when) and why
      for key in keys:
        assert key in config_fields.KEYS, key
        assert key.startswith(name + "." if name else ""), (name, key)
  assert len(config_ranges.UNUSED_WHEN) == rules >= 17
