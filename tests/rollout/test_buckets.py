"""rollout.buckets: Libra's C-MLFQ over the multi-turn sampler (episodes moved between batches)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posttrain_jax import models, rollout
from posttrain_jax.rollout import buckets

EOS, PAD, V = 1, 0, 19
T = 32
STOP = (7,)


def _flat(vocab):
  """A nano model with a zero final norm: uniform next tokens (calls and EOS come often)."""
  graphdef, params = nnx.split(
    models.Decoder(models.preset("nano", vocab_size=vocab), rngs=nnx.Rngs(0))
  )
  params = jax.tree.map(lambda x: x, params)
  params["final_norm"][...] = jnp.zeros_like(params["final_norm"][...])
  return graphdef, params


@pytest.fixture(scope="module")
def flat():
  return _flat(V)


@pytest.fixture(scope="module")
def plain():
  return nnx.split(models.Decoder(models.preset("nano", vocab_size=V), rngs=nnx.Rngs(1)))


def _prompts(rows):
  ids = [[5, 6, 8], [8, 9, 10, 11, 12, 13], [4], [3, 4, 5, 6]]
  tokens, mask = rollout.left_pad([ids[i % 4] for i in range(rows)], PAD)
  return jnp.asarray(tokens), jnp.asarray(mask)


class Recorder:
  """Answers episode e's k-th call with e % 3 + 1 tokens ``[10 + k, ...]``, records every
  (episode, turn, observation, end) and ends an episode at its ``end_after``-th call."""

  def __init__(self, end_after=None):
    self.calls, self.count, self.end_after = [], {}, end_after

  def __call__(self, rows, turns):
    out = []
    for e, turn in zip(rows, turns):
      e = int(e)
      k = self.count.get(e, 0)
      self.count[e] = k + 1
      obs = [10 + (k + j) % 8 for j in range(e % 3 + 1)]
      end = self.end_after is not None and k + 1 >= self.end_after
      self.calls.append((e, list(map(int, turn)), obs, end))
      out.append((obs, end))
    return out


def _cfg(temperature=1.0, eos=EOS):
  return rollout.SamplerConfig(
    max_new_tokens=T, eos_id=eos, pad_id=PAD, temperature=temperature, decode_chunk=0
  )


def _walk(ro, calls, stop=STOP, eos=EOS):
  """(own, env) masks [N, T] from a plain walk over each episode's completion and its recorded
  calls, asserting that each recorded turn is the episode's own tokens since its last
  insertion and that every call's observation follows it (cut only by the budget T)."""
  comp = np.asarray(ro.completion)
  N, m = comp.shape[0], len(stop)
  own, env = np.zeros((N, T)), np.zeros((N, T))
  per = {}
  for e, turn, obs, end in calls:
    per.setdefault(e, []).append((turn, obs, end))
  for b in range(N):
    queue, t, turn = list(per.get(b, [])), 0, []
    while t < T:
      tok = int(comp[b, t])
      own[b, t], t = 1, t + 1
      turn.append(tok)
      if tok == eos:
        break
      if len(turn) >= m and tuple(turn[-m:]) == tuple(stop) and t < T:
        assert queue, f"episode {b}: a call ending at {t - 1} was not answered"
        rturn, obs, end = queue.pop(0)
        assert rturn == turn, f"episode {b}: respond got {rturn}, its turn was {turn}"
        k = min(len(obs), T - t)
        np.testing.assert_array_equal(comp[b, t : t + k], obs[:k])
        env[b, t : t + k] = 1
        t, turn = t + k, []
        if end:
          break
    assert not queue, f"episode {b}: a recorded call was never in its transcript"
  return own, env


def test_one_bucket_is_fifo_batching(flat):
  """(B, T, 0) equals the multi-turn sampler on each batch of B episodes in turn."""
  graphdef, params = flat
  B, N = 8, 24
  tokens, mask = _prompts(N)
  turns = rollout.TurnConfig(STOP, 4)
  sched = buckets.BucketScheduler(graphdef, _cfg(), turns, buckets.fifo(B, T))
  ro = sched(params, tokens, mask, jax.random.key(3), respond=Recorder())
  sampler = rollout.make_multi_turn_sampler(graphdef, _cfg(), turns)
  for k in range(N // B):
    rows = slice(k * B, (k + 1) * B)
    rec = Recorder()
    ref = sampler(
      params,
      tokens[rows],
      mask[rows],
      jax.random.fold_in(jax.random.key(3), k),
      respond=lambda r, t, rec=rec, k=k: rec(np.asarray(r) + k * B, t),
    )
    np.testing.assert_array_equal(ro.tokens[rows], ref.tokens)
    np.testing.assert_array_equal(ro.completion_mask[rows], ref.completion_mask)
    np.testing.assert_array_equal(ro.env_mask[rows], ref.env_mask)
    np.testing.assert_allclose(ro.logprobs[rows], ref.logprobs, atol=1e-6)
    np.testing.assert_array_equal(ro.truncated[rows], ref.truncated)
  assert sched.last_stats.batches == N // B
  assert all(h == [0] for h in sched.history)


CMLFQ = (buckets.Bucket(8, 8, calls=1), buckets.Bucket(4, 8, calls=2), buckets.Bucket(4, 16))
# Continuous batching in the first level: freed rows take fresh episodes mid-batch.
REFILL = (buckets.Bucket(8, 24, calls=2, refill=True), buckets.Bucket(4, 8), buckets.Bucket(4, 16))


@pytest.mark.parametrize("levels", [CMLFQ, REFILL], ids=["cmlfq", "refill"])
def test_episodes_are_conserved_demoted_monotonically_and_their_masks_exact(flat, levels):
  """Across batches (and, refilled, within a row) an episode keeps its transcript: every call
  is answered once, with its whole turn, and its observation follows it."""
  graphdef, params = flat
  stop, N = STOP, 20
  tokens, mask = _prompts(N)
  rec = Recorder()
  sched = buckets.BucketScheduler(graphdef, _cfg(), rollout.TurnConfig(stop, 4), levels)
  ro = sched(params, tokens, mask, jax.random.key(0), respond=rec)
  assert ro.tokens.shape == (N, tokens.shape[1] + T)
  own, env = _walk(ro, rec.calls, stop)
  np.testing.assert_array_equal(ro.completion_mask, own)
  np.testing.assert_array_equal(ro.env_mask, env)
  np.testing.assert_array_equal(ro.tokens[:, : tokens.shape[1]], tokens)
  assert len(sched.history) == N
  assert all(h == sorted(h) and h[0] == 0 for h in sched.history)  # monotone demotion
  assert max(len(h) for h in sched.history) >= 3, "some episode should reach the last bucket"
  assert set(sched.last_stats.per_bucket) == {0, 1, 2}
  # Not truncated: ended by EOS inside the budget; truncated: the budget is full.
  comp = np.asarray(ro.completion)
  for b in range(N):
    ended = np.any((comp[b] == EOS) & (own[b] > 0))
    assert bool(ro.truncated[b]) == (not ended), b


def test_a_call_end_cut_by_a_quantum_is_still_found():
  """A two-token call end whose tokens fall in two batches (quanta of 3 tokens; vocabulary of
  6, so the end comes often; no EOS) is answered like one written in a single batch."""
  graphdef, params = _flat(6)
  stop, N = (3, 4), 32
  tokens, mask = rollout.left_pad([[2, 5, 2][: 1 + i % 3] for i in range(N)], PAD)
  rec = Recorder()
  small = lambda rows, turns: [
    ([2, 5][: 1 + int(e) % 2], end) for e, (_, end) in zip(rows, rec(rows, turns))
  ]
  sched = buckets.BucketScheduler(
    graphdef, _cfg(eos=6), rollout.TurnConfig(stop, 2), (buckets.Bucket(8, 3), buckets.Bucket(8, 3))
  )
  ro = sched(params, jnp.asarray(tokens), jnp.asarray(mask), jax.random.key(4), respond=small)
  rec.calls = [(e, turn, [2, 5][: 1 + e % 2], end) for e, turn, _, end in rec.calls]
  comp = np.asarray(ro.completion)
  straddled = sum(
    comp[e, p - 1] == 3 and comp[e, p] == 4 and np.asarray(ro.completion_mask)[e, p - 1] > 0
    for e in range(N)
    for p in sched.starts[e][1:]
  )
  assert len(rec.calls) >= 16 and straddled >= 2
  own, env = _walk(ro, rec.calls, stop, eos=6)
  np.testing.assert_array_equal(ro.completion_mask, own)
  np.testing.assert_array_equal(ro.env_mask, env)


def test_host_end_stops_an_episode_in_any_bucket(flat):
  graphdef, params = flat
  N = 16
  tokens, mask = _prompts(N)
  rec = Recorder(end_after=2)
  sched = buckets.BucketScheduler(graphdef, _cfg(), rollout.TurnConfig(STOP, 4), CMLFQ)
  ro = sched(params, tokens, mask, jax.random.key(1), respond=rec)
  own, env = _walk(ro, rec.calls)
  np.testing.assert_array_equal(ro.completion_mask, own)
  np.testing.assert_array_equal(ro.env_mask, env)
  ended = [e for e, n in rec.count.items() if n == 2]
  assert ended and max(rec.count.values()) == 2
  for e in ended:  # its second call is its last own token; it is not truncated
    last = np.flatnonzero(own[e])[-1]
    assert int(np.asarray(ro.completion)[e, last]) == STOP[0]
    assert not bool(ro.truncated[e])


@pytest.mark.parametrize("with_prefix,refill", [(False, False), (True, False), (False, True)])
def test_behaviour_logprobs_equal_a_recomputed_forward(flat, plain, with_prefix, refill):
  """A continued episode is prefilled from its transcript, a refilled row's episode starts
  its positions again: the log-probs are those of one forward over each whole rollout."""
  for graphdef, params in (flat, plain):
    N = 12
    tokens, mask = _prompts(N)
    prefix = (
      (np.tile(np.asarray([[15, 16, 17, 18]], np.int32), (N, 1)), np.arange(N) % 5)
      if with_prefix
      else None
    )
    levels = (
      (buckets.Bucket(4, 16, 1, refill=True), buckets.Bucket(4, 8))
      if refill
      else (buckets.Bucket(8, 3, 1), buckets.Bucket(4, 8))
    )
    sched = buckets.BucketScheduler(graphdef, _cfg(0.8), rollout.TurnConfig(STOP, 4), levels)
    ro = sched(params, tokens, mask, jax.random.key(2), respond=Recorder(), prefix=prefix)
    assert max(map(len, sched.history)) >= (2 if refill else 3)
    if refill:  # fewer batches than 12 episodes in rows of 4 would need without refill
      assert sched.last_stats.per_bucket[0] < 3
    if with_prefix:  # a prefix longer than the first quantum is finished in a later batch
      comp = np.asarray(ro.completion)
      for b in range(N):
        np.testing.assert_array_equal(comp[b, : b % 5], [15, 16, 17, 18][: b % 5])
        assert np.all(np.asarray(ro.env_mask)[b, : b % 5] == 1)
    m = nnx.merge(graphdef, params)
    logits = m(jnp.asarray(ro.tokens[:, :-1]), start=ro.start).logits[:, ro.prompt_len - 1 :]
    ref = models.gather_logprobs(logits / 0.8, jnp.asarray(ro.completion))
    np.testing.assert_allclose(ro.logprobs, np.asarray(ref) * ro.completion_mask, atol=3e-5)


def test_refilled_rows_decode_less_than_static_batches(flat):
  """Continuous batching of the same episodes: freed rows take the next ones, so fewer rows
  idle (fewer row-steps) and a row hosts several episodes."""
  graphdef, params = flat
  N = 24
  tokens, mask = _prompts(N)
  turns = rollout.TurnConfig(STOP, 4)
  cost = {}
  for refill in (False, True):
    rec = Recorder(end_after=3)
    sched = buckets.BucketScheduler(graphdef, _cfg(), turns, buckets.fifo(8, T, refill))
    ro = sched(params, tokens, mask, jax.random.key(6), respond=rec)
    own, env = _walk(ro, rec.calls)
    np.testing.assert_array_equal(ro.completion_mask, own)
    np.testing.assert_array_equal(ro.env_mask, env)
    cost[refill] = sched.last_stats.row_steps
    if refill:
      assert sched.last_stats.real_rows > sched.last_stats.rows  # rows hosted > 1 episode
  assert cost[True] < cost[False]


def test_bad_buckets_are_refused(flat):
  with pytest.raises(ValueError, match="width"):
    buckets.Bucket(0, 8)
  with pytest.raises(ValueError, match="calls"):
    buckets.Bucket(4, 8, calls=-1)
  with pytest.raises(ValueError, match="at least one"):
    buckets.BucketScheduler(flat[0], _cfg(), rollout.TurnConfig(STOP, 4), ())
