"""``pretrain.levels``: a pretraining corpus over several levels in equal shares."""

import jax
import pytest
from rl_fixtures import smoke_config

from posttrain_jax import methods as methods_lib
from posttrain_jax.registry import ConfigError
from posttrain_jax.train import pretrain


def _decode(ctx, batch):
  tok = ctx.tokenizer
  rows = []
  for tokens, mask in zip(batch["tokens"], batch["loss_mask"]):
    start = int(mask.argmax())
    rows.append(tok.decode(tokens[:start].tolist()))
  return rows


def test_levels_split_every_batch_in_equal_shares_and_one_level_is_unchanged(tmp_path):
  c = smoke_config(1)
  c.env.name, c.env.level = "arithmetic", 2
  c.pretrain.levels = (1, 2, 3)
  methods_lib.validate(c)
  ctx = methods_lib.make_context(c, str(tmp_path))
  seq_len = ctx.prompt_len + c.rl.max_new_tokens
  key = jax.random.key(3)
  batch = pretrain.sft_batch(ctx, key, 10, seq_len, 0.0)
  want = []
  for level, n in ((1, 3), (2, 3), (3, 4)):  # 10 rows over 3 levels: 3, 3, 4
    want += [p for p, _ in ctx.env.corpus(jax.random.fold_in(key, level), n, level=level)]
  got = _decode(ctx, batch)
  assert [g.replace(" ", "") for g in got] == [w.replace(" ", "") for w in want]
  # The shares really are different levels: level-1 operands have 1 digit, level-3 ones 3.
  assert max(len(s) for s in want[:3]) < min(len(s) for s in want[6:])
  # One level (or none given) draws exactly what a single-level corpus draws.
  assert ctx.config is c
  c.pretrain.levels = ()
  want = [p for p, _ in ctx.env.corpus(key, 6, level=2)]
  got = _decode(ctx, pretrain.sft_batch(ctx, key, 6, seq_len, 0.0))
  assert [g.replace(" ", "") for g in got] == [w.replace(" ", "") for w in want]


def test_a_level_the_env_lacks_is_refused():
  c = smoke_config(1)
  c.env.name, c.env.level = "arithmetic", 2
  c.pretrain.levels = (1, 99)
  with pytest.raises(ConfigError, match=r"pretrain.levels has \[99\]"):
    methods_lib.validate(c)
