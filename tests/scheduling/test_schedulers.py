"""The SCHEDULERS registry and the common protocol: every scheduler runs the trainer's call
sequence, keeps static shapes, and resumes from a saved state to the same results."""

import ast
import io
import json
import os

import jax
import numpy as np
import pytest

from posttrain_jax import scheduling
from posttrain_jax.envs.base import Problem
from posttrain_jax.scheduling import SCHEDULERS

POOL = [Problem(prompt=f"q{i}", answer="1", env="toy", level=0, uid=f"u{i}") for i in range(30)]
P, G, T = 6, 4, 3
KWARGS = {
  "cero": {"g_max": 8},
  "rollout_replay": {"tau_max": 2, "replay_count": 6},
  "group_replay": {"replay_count": 8},
  "review": {"rho": 0.34, "tau": 0.75},
  "uniform_review": {"rho": 0.34},
}


def _step(sched, t, key):
  """One trainer iteration through the protocol (see scheduling/__init__.py)."""
  data = np.random.default_rng([t, 7])
  batch = [POOL[i] for i in data.choice(len(POOL), P, replace=False)]
  sel = sched.select(t, batch, jax.random.fold_in(key, 2 * t))
  truth = np.array([int(p.uid[1:]) / 30 for p in sel.problems])[sel.group]
  rewards = (data.uniform(size=sel.rows) < truth).astype(np.float32) * sel.valid
  adv = _grpo(rewards, sel.group, sel.valid)
  rows = {
    "tokens": data.integers(0, 9, size=(sel.rows, 2 + T)).astype(np.int32),
    "completion_mask": np.ones((sel.rows, T), np.float32),
    "advantages": adv,
    "rewards": rewards,
    "valid": sel.valid,
    "group": sel.group,
  }
  out = sched.compose(t, rows, jax.random.fold_in(key, 2 * t + 1), uids=sel.row_uids())
  metrics = sched.observe(t, sel.problems, rewards, sel.group, sel.valid, advantages=adv)
  return sel, out, metrics


def _grpo(rewards, group, valid):
  """Host GRPO advantages (group-centred, std-normalised, padding rows 0)."""
  adv = np.zeros_like(rewards)
  for g in np.unique(group):
    rows = (group == g) & (valid > 0)
    r = rewards[rows]
    adv[rows] = (r - r.mean()) / (r.std(ddof=1) + 1e-6) if len(r) > 1 else 0.0
  return adv


def _flatten(tree, prefix=""):
  out = {}
  for k, v in tree.items():
    out.update(_flatten(v, f"{prefix}{k}/") if isinstance(v, dict) else {f"{prefix}{k}": v})
  return out


def _savez(tree):
  """Through np.savez and back (what a trainer without orbax would do)."""
  f = io.BytesIO()
  np.savez(f, **_flatten(tree))
  f.seek(0)
  loaded, out = np.load(f), {}
  for name in loaded.files:
    *path, leaf = name.split("/")
    node = out
    for p in path:
      node = node.setdefault(p, {})
    node[leaf] = loaded[name]
  return out


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_protocol_static_shapes_and_resume(name):
  key = jax.random.key(0)
  sched = scheduling.make(name, group_size=G, **KWARGS.get(name, {}))
  shapes = set()
  for t in range(6):
    sel, out, metrics = _step(sched, t, key)
    assert len(sel.problems) == P and sel.group_sizes.sum() <= P * G
    np.testing.assert_array_equal(
      np.bincount(sel.group, weights=sel.valid, minlength=P), sel.group_sizes
    )
    shapes.add((sel.rows, len(out.rows["valid"])))
    assert all(isinstance(v, float) for v in metrics.values())
  assert len(shapes) == 1  # one compiled shape per run
  st = sched.state_dict()
  saved = {"meta": json.loads(json.dumps(st["meta"])), "arrays": _savez(st["arrays"])}
  rest = scheduling.make(name, group_size=G, **KWARGS.get(name, {}))
  rest.load_state_dict(saved)
  for t in range(6, 10):
    a, b = _step(sched, t, key), _step(rest, t, key)
    assert [p.uid for p in a[0].problems] == [p.uid for p in b[0].problems]
    np.testing.assert_array_equal(a[0].valid, b[0].valid)
    for k in a[1].rows:
      np.testing.assert_array_equal(a[1].rows[k], b[1].rows[k])
    assert json.dumps(a[2]) == json.dumps(b[2])


def test_unknown_name_lists_valid_ones_and_wrong_state_is_refused():
  with pytest.raises(ValueError, match="cero, group_replay, none"):
    scheduling.make("nope", group_size=4)
  state = scheduling.make("cero", group_size=4).state_dict()
  with pytest.raises(ValueError, match="loaded into"):
    scheduling.make("review", group_size=4).load_state_dict(state)


def test_uniform_is_todays_batch():
  sel = scheduling.make("none", group_size=3).select(0, POOL[:4], None)
  np.testing.assert_array_equal(sel.group, np.repeat(np.arange(4), 3))
  assert sel.valid.tolist() == [1.0] * 12 and sel.group_sizes.tolist() == [3] * 4


def test_scheduling_never_imports_train():
  root = os.path.dirname(scheduling.__file__)
  for name in os.listdir(root):
    if name.endswith(".py"):
      tree = ast.parse(open(os.path.join(root, name), encoding="utf-8").read())
      for node in ast.walk(tree):
        mods = (
          [a.name for a in node.names]
          if isinstance(node, ast.Import)
          else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        )
        for mod in mods:
          assert not mod.startswith(("posttrain_jax.train", "posttrain_jax.sweeps")), (name, mod)
