"""Replay buffers: age cap, fresh anchoring, no zero-advantage storage, no duplicates, priority
frequencies, determinism, save/restore, the naive group-level baseline."""

import io
import json

import jax
import numpy as np
import pytest

from posttrain_jax.scheduling import (
  GroupReplay,
  RolloutReplay,
  rollout_from_rows,
  rows_from_rollout,
)

P, G, T = 4, 4, 3


def _fresh(step, rng, zero_frac=0.3):
  """P*G rows; ``rid`` is a unique row id (step * 1000 + row) to audit what comes back."""
  R = P * G
  adv = rng.normal(size=R).astype(np.float32)
  adv[rng.uniform(size=R) < zero_frac] = 0.0
  valid = (rng.uniform(size=R) > 0.1).astype(np.float32)
  return {
    "tokens": rng.integers(0, 50, size=(R, 2 + T)).astype(np.int32),
    "completion_mask": np.ones((R, T), np.float32),
    "logprobs": rng.normal(size=(R, T)).astype(np.float32),
    "group": np.repeat(np.arange(P, dtype=np.int32), G),
    "policy_version": np.full(R, step, np.int32),
    "rid": step * 1000 + np.arange(R, dtype=np.int64),
    "advantages": adv,
    "valid": valid,
    "rewards": rng.uniform(size=R).astype(np.float32),
  }


def _run(buf, steps, seed=0, start=0, data_seed=1):
  data, outs = np.random.default_rng(data_seed + start), []
  for t in range(start, start + steps):
    fresh = _fresh(t, data)
    outs.append(
      (
        fresh,
        buf.compose(
          t, fresh, np.random.default_rng([seed, t]), uids=[f"u{r}" for r in fresh["rid"]]
        ),
      )
    )
  return outs


@pytest.mark.parametrize("tau_max", [1, 2, 4])
def test_age_cap_fresh_anchoring_no_duplicates(tau_max):
  buf = RolloutReplay(tau_max=tau_max, replay_fraction=0.5)
  storable = []
  for t, (fresh, out) in enumerate(_run(buf, 25)):
    storable.append(int(((fresh["advantages"] != 0) & (fresh["valid"] > 0)).sum()))
    rows = out.rows
    R = P * G
    assert len(rows["valid"]) == R + 8 and rows["is_replay"].shape == (R + 8,)
    for k, v in fresh.items():  # every fresh rollout, unchanged and first
      np.testing.assert_array_equal(rows[k][:R], v)
    rep = rows["is_replay"] > 0
    assert not rep[:R].any()
    born = rows["rid"][rep] // 1000
    assert np.all(t - born >= 1) and np.all(t - born <= tau_max)
    np.testing.assert_array_equal(rows["age"][rep], t - born)
    assert len(np.unique(rows["rid"][rep])) == rep.sum()  # no duplicates within a batch
    assert np.all(rows["valid"][rep] > 0) and np.all(rows["advantages"][rep] != 0)
    assert np.all(rows["valid"][R:][~rep[R:]] == 0)  # missing replay rows are padding
    assert out.uids[R:][: rep.sum()] == [f"u{r}" for r in rows["rid"][rep]]
    assert rep.sum() == min(8, sum(storable[max(0, t - tau_max) : t]))
    store = buf.store
    assert np.all(np.abs(store.fields["advantages"]) > 0) and np.all(store.fields["valid"] > 0)
    assert np.all(t - store.born <= tau_max)


def test_zero_advantage_and_padding_rows_are_never_stored():
  buf = RolloutReplay(tau_max=3, replay_count=4)
  fresh = _fresh(0, np.random.default_rng(0), zero_frac=0.5)
  buf.compose(0, fresh, np.random.default_rng(0))
  keep = (fresh["advantages"] != 0) & (fresh["valid"] > 0)
  np.testing.assert_array_equal(buf.store.fields["rid"], fresh["rid"][keep])
  assert buf.counters["dropped_zero"] == int(
    ((fresh["advantages"] == 0) & (fresh["valid"] > 0)).sum()
  )


def test_token_level_advantages_use_masked_mean_priority():
  buf = RolloutReplay(tau_max=2, replay_count=2)
  rows = {
    "advantages": np.array([[0.0, 0.0], [1.0, 9.0], [2.0, 0.0]], np.float32),
    "completion_mask": np.array([[1, 1], [1, 0], [1, 1]], np.float32),
    "valid": np.ones(3, np.float32),
  }
  buf.compose(0, rows, np.random.default_rng(0))
  np.testing.assert_allclose(buf.store.priority, [1.0, 1.0])


def _chi2(counts, probs):
  expected = probs * counts.sum()
  return float(np.sum((counts - expected) ** 2 / expected))


@pytest.mark.parametrize("alpha", [1.0, 0.0])
def test_priority_sampling_frequencies_follow_abs_advantage(alpha):
  buf = RolloutReplay(tau_max=5, replay_count=1, alpha=alpha)
  adv = np.array([0.5, -1.0, 1.5, -2.0, 3.0], np.float32)
  buf.compose(
    0,
    {"advantages": adv, "valid": np.ones(5, np.float32), "rid": np.arange(5)},
    np.random.default_rng(0),
  )
  rng, counts = np.random.default_rng(123), np.zeros(5)
  for _ in range(5_000):
    counts[buf.sample(1, 1, rng)[1]["rid"]] += 1
  w = np.abs(adv) ** alpha
  assert _chi2(counts, w / w.sum()) < 18.47  # chi2(df=4) at p = 0.001


def test_without_replacement_draws_match_successive_sampling():
  """Inclusion frequencies of a 2-of-3 draw equal the exact successive-sampling probabilities."""
  w = np.array([1.0, 2.0, 3.0])
  exact = np.array(
    [
      w[i] / w.sum() + sum(w[j] / w.sum() * w[i] / (w.sum() - w[j]) for j in range(3) if j != i)
      for i in range(3)
    ]
  )
  buf = RolloutReplay(tau_max=5, replay_count=2)
  buf.compose(
    0, {"advantages": w, "valid": np.ones(3), "rid": np.arange(3)}, np.random.default_rng(0)
  )
  rng, counts = np.random.default_rng(7), np.zeros(3)
  for _ in range(4_000):
    counts[buf.sample(1, 2, rng)[1]["rid"]] += 1
  np.testing.assert_allclose(counts / 4_000, exact, atol=0.03)


def test_deterministic_with_generator_or_jax_key():
  a, b = _run(RolloutReplay(tau_max=3), 12), _run(RolloutReplay(tau_max=3), 12)
  for (_, x), (_, y) in zip(a, b):
    for k in x.rows:
      np.testing.assert_array_equal(x.rows[k], y.rows[k])
  outs = []
  for _ in range(2):
    buf, data = RolloutReplay(tau_max=3), np.random.default_rng(0)
    outs.append(
      [
        buf.compose(t, _fresh(t, data), jax.random.fold_in(jax.random.key(0), t)).rows["rid"]
        for t in range(8)
      ]
    )
  for x, y in zip(*outs):
    np.testing.assert_array_equal(x, y)


def _savez_round_trip(arrays):
  flat = {"rows." + k: v for k, v in arrays["rows"].items()}
  flat.update({k: v for k, v in arrays.items() if k != "rows"})
  f = io.BytesIO()
  np.savez(f, **flat)
  f.seek(0)
  loaded = np.load(f)
  return {
    "rows": {k[5:]: loaded[k] for k in loaded.files if k.startswith("rows.")},
    **{k: loaded[k] for k in loaded.files if not k.startswith("rows.")},
  }


@pytest.mark.parametrize("kind,pad_to", [("rollout", None), ("rollout", 64), ("group", None)])
def test_state_round_trip_continues_identically(kind, pad_to):
  make = (
    (lambda: RolloutReplay(tau_max=3, replay_fraction=0.5))
    if kind == "rollout"
    else (lambda: GroupReplay(capacity=5, replay_count=6))
  )
  straight = make()
  _run(straight, 6)
  arrays, meta = straight.state_dict(pad_to)
  if pad_to:
    assert all(len(v) == pad_to for v in arrays["rows"].values())
  restored = make()
  restored.load_state_dict(_savez_round_trip(arrays), json.loads(json.dumps(meta)))
  a, b = _run(straight, 6, start=6), _run(restored, 6, start=6)
  for (_, x), (_, y) in zip(a, b):
    assert x.rows.keys() == y.rows.keys()
    for k in x.rows:
      np.testing.assert_array_equal(x.rows[k], y.rows[k])
    assert x.uids == y.uids
  assert straight.counters == restored.counters


def test_group_replay_fifo_capacity_uniform_and_keeps_zero_advantage_rows():
  buf = GroupReplay(capacity=3, replay_count=10)
  for _, out in _run(buf, 12):
    rep = out.rows["is_replay"] > 0
    assert rep.sum() <= 10 and len(np.unique(out.rows["rid"][rep])) == rep.sum()
    assert len(np.unique(buf.store.gid)) <= 3  # FIFO capacity in groups
  fresh = _fresh(0, np.random.default_rng(3), zero_frac=1.0)
  buf = GroupReplay(capacity=10, replay_count=4)
  buf.compose(0, fresh, np.random.default_rng(0))
  assert len(buf.store) == int(fresh["valid"].sum())  # the naive arm stores every valid row
  # uniform over groups: 4 equal-size stored groups, one drawn per step
  buf = GroupReplay(capacity=10, replay_count=4)
  rows = {
    "advantages": np.arange(16.0),
    "valid": np.ones(16),
    "group": np.repeat(np.arange(4), 4),
    "rid": np.arange(16),
  }
  buf.compose(0, rows, np.random.default_rng(0))
  rng, counts = np.random.default_rng(1), np.zeros(4)
  for _ in range(2000):
    counts[buf.sample(1, 4, rng)[1]["rid"][0] // 4] += 1
  assert _chi2(counts, np.full(4, 0.25)) < 16.27  # chi2(df=3) at p = 0.001


def test_group_replay_returns_complete_groups():
  buf = GroupReplay(capacity=50, replay_count=8)
  history = {}
  for t, (fresh, out) in enumerate(_run(buf, 10)):
    for g in range(P):
      sel = (fresh["group"] == g) & (fresh["valid"] > 0)
      history[(t, g)] = set(fresh["rid"][sel])
    rep = out.rows["is_replay"] > 0
    got = {}
    for r, g in zip(out.rows["rid"][rep], out.rows["group"][rep]):
      got.setdefault((int(r // 1000), int(g)), set()).add(r)
    for key, rids in got.items():
      assert rids == history[key]


def test_rows_rollout_round_trip_and_errors():
  from posttrain_jax.rollout.types import Rollout

  R = 3
  ro = Rollout(
    tokens=np.zeros((R, 5), np.int32),
    prompt_mask=np.ones((R, 2), np.float32),
    completion_mask=np.ones((R, 3), np.float32),
    logprobs=np.zeros((R, 3), np.float32),
    lengths=np.full(R, 3, np.int32),
    truncated=np.zeros(R, bool),
    group=np.arange(R, dtype=np.int32),
    policy_version=np.zeros(R, np.int32),
  )
  rows = rows_from_rollout(ro, advantages=np.ones(R), valid=np.ones(R))
  back = rollout_from_rows(rows)
  for name in ("tokens", "prompt_mask", "group", "policy_version"):
    np.testing.assert_array_equal(getattr(back, name), getattr(ro, name))
  buf = RolloutReplay(tau_max=2)
  buf.compose(0, rows, np.random.default_rng(0))
  with pytest.raises(ValueError, match="keys"):
    buf.compose(1, {"advantages": np.ones(R), "valid": np.ones(R)}, np.random.default_rng(0))
  with pytest.raises(ValueError, match="advantages"):
    buf.compose(1, {"valid": np.ones(R)}, np.random.default_rng(0))
  with pytest.raises(ValueError, match="tau_max"):
    RolloutReplay(tau_max=None)


def test_no_replay_share_is_plain_grpo():
  buf = RolloutReplay(tau_max=2, replay_count=0)
  for fresh, out in _run(buf, 4):
    assert len(out.rows["valid"]) == P * G and not out.rows["is_replay"].any()
    for k, v in fresh.items():
      np.testing.assert_array_equal(out.rows[k], v)
