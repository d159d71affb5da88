"""The config's declarations (posttrain_jax/fields.py, train/config_fields/): the default config,
the ranges and the rerun table are derived from them, and the declarations are consistent."""

import dataclasses

import ml_collections
import pytest

from posttrain_jax import defaults, fields, methods
from posttrain_jax.train import config_fields, config_ranges, hooks, workdir
from posttrain_jax.train import stages as stages_lib


def test_every_default_lies_in_its_declared_range():
  for key, k in defaults.KEYS.items():
    if k.kind:
      test, want, refused = fields.KINDS[k.kind]
      assert test(k.default), f"{key}={k.default!r} is not {want}"
      assert not test(refused)


def test_every_key_has_a_doc_and_a_stage_of_the_table():
  for key, k in defaults.KEYS.items():
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
  assert set(base) == set(defaults.KEYS)
  for key, k in defaults.KEYS.items():
    want = {} if k.free else k.default
    got = base[key].to_dict() if isinstance(base[key], ml_collections.ConfigDict) else base[key]
    assert got == want, key
  assert defaults.base_config().rl.get_ref("norm_length").get_type() is int  # a typed None


def test_the_range_table_is_the_declared_kinds():
  numeric = config_ranges.numeric_keys(defaults.ROOT)
  assert numeric == {key: k.kind for key, k in defaults.KEYS.items() if k.kind}
  assert numeric["rl.lr"] == "positive" and numeric["rl.save.lr"] == "positive"
  assert "rl.save.lr" not in config_ranges.numeric_keys()  # the engine's alone


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
  declared = workdir._declared(key, defaults.KEYS)  # pylint: disable=protected-access
  assert declared.stage == stage
  assert workdir._ignored(key, defaults.KEYS) is (not reruns)  # pylint: disable=protected-access


def test_a_declaration_with_an_unknown_kind_is_refused():
  with pytest.raises(ValueError, match="unknown kind 'countt'"):
    fields.Field(1, "x", kind="countt")


def test_every_unused_rule_lives_in_the_section_that_owns_its_keys():
  rules = 0
  for name, section in fields.sections(defaults.ROOT).items():
    for keys, when, why in section.unused:
      rules += 1
      assert callable(when) and why
      for key in keys:
        assert key in defaults.KEYS, key
        assert key.startswith(name + "." if name else ""), (name, key)
  assert len(config_ranges.unused_rules(defaults.ROOT)) == rules >= 17


def test_a_method_declares_its_section_in_its_folder():
  by_path = {path: m.name for m in methods.METHODS for path in m.fields}
  assert by_path == {
    "rl.teacher": "teacher",
    "rl.save": "save",
    "rl.denoise": "denoise",
    "rl.sft_mix": "sft_mix",
    "agent": "agent",
    "rl.pr2": "pr2",
    "rl.dump_rollouts": "rollout_dump",
    "rl.pass_band": "pass_band",
  }
  assert "rl.save.lr" in defaults.KEYS and "rl.save.lr" not in config_fields.KEYS
  assert defaults.KEYS["rl.save.lr"].stage == "rl"  # inherits the rl section's stage
  save = next(m for m in methods.METHODS if m.name == "save")
  with pytest.raises(ValueError, match="config section 'rl.save' is declared twice"):
    hooks.config_root(methods.METHODS + (dataclasses.replace(save, name="save2"),))
  stray = dataclasses.replace(save, name="stray", fields={"nope.x": fields.Section("x")})
  with pytest.raises(ValueError, match="there is no section 'nope' to hold it"):
    hooks.config_root((stray,))
