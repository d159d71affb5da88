"""rollout.multi_turn: insertions between the model's turns, their masks and log-probs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posttrain_jax import models, rollout

EOS, PAD, V = 1, 0, 19
STOP = (7,)  # a one-token "</tool>": a flat model writes it about once in 19 tokens
T = 24


@pytest.fixture(scope="module")
def flat():
  """A nano model with a zero final norm: uniform next-token distribution (EOS and the stop
  token come often)."""
  model = models.Decoder(models.preset("nano", vocab_size=V), rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  params = jax.tree.map(lambda x: x, params)
  params["final_norm"][...] = jnp.zeros_like(params["final_norm"][...])
  return graphdef, params


@pytest.fixture(scope="module")
def plain():
  model = models.Decoder(models.preset("nano", vocab_size=V), rngs=nnx.Rngs(1))
  return nnx.split(model)


def _prompts(rows=24):
  ids = [[5, 6, 8], [8, 9, 10, 11, 12, 13], [4]]
  tokens, mask = rollout.left_pad(ids, PAD)
  reps = rows // 3
  return jnp.asarray(np.repeat(tokens, reps, 0)), jnp.asarray(np.repeat(mask, reps, 0))


class Recorder:
  """A respond that answers row r's k-th call with r % 3 + 1 tokens ``[10 + k, 11 + k, ...]``
  and records (row, turn ids, observation); ends a row at its ``end_after``-th call."""

  def __init__(self, end_after=None):
    self.calls, self.count, self.end_after = [], {}, end_after

  def __call__(self, rows, turns):
    out = []
    for r, turn in zip(rows, turns):
      k = self.count.get(int(r), 0)
      self.count[int(r)] = k + 1
      obs = [10 + k + j for j in range(int(r) % 3 + 1)]
      end = self.end_after is not None and k + 1 >= self.end_after
      self.calls.append((int(r), list(map(int, turn)), obs))
      out.append((obs, end))
    return out


def _sampler(graphdef, temperature=1.0, stop=STOP, Q=4):
  cfg = rollout.SamplerConfig(
    max_new_tokens=T, eos_id=EOS, pad_id=PAD, temperature=temperature, decode_chunk=0
  )
  return rollout.make_multi_turn_sampler(graphdef, cfg, rollout.TurnConfig(stop, Q))


def _expected_masks(ro, calls, prefix_len=None):
  """Walks each row's completion with the recorded calls: (own, env) masks [B, T] built by a
  plain loop, independent of the sampler's bookkeeping."""
  comp = np.asarray(ro.completion)
  B = comp.shape[0]
  own, env = np.zeros((B, T)), np.zeros((B, T))
  per_row = {}
  for r, _, obs in calls:
    per_row.setdefault(r, []).append(obs)
  for b in range(B):
    queue = list(per_row.get(b, []))
    t = 0
    n = 0 if prefix_len is None else int(prefix_len[b])
    env[b, :n] = 1
    t = n
    while t < T:
      tok = comp[b, t]
      own[b, t] = 1
      t += 1
      if tok == EOS:
        break
      if tok == STOP[0] and queue:
        obs = queue.pop(0)
        k = min(len(obs), T - t)
        env[b, t : t + k] = 1
        t += k
    assert not queue, f"row {b}: a recorded observation was never written"
  return own, env


def test_no_insertions_equal_single_turn_sampler(plain):
  graphdef, params = plain
  tokens, mask = _prompts()
  cfg = rollout.SamplerConfig(max_new_tokens=T, eos_id=EOS, pad_id=PAD, decode_chunk=0)
  ref = rollout.make_sampler(graphdef, cfg)(params, tokens, mask, jax.random.key(4))
  ro = _sampler(graphdef, stop=())(params, tokens, mask, jax.random.key(4))
  np.testing.assert_array_equal(ro.tokens, ref.tokens)
  np.testing.assert_array_equal(ro.completion_mask, ref.completion_mask)
  np.testing.assert_allclose(ro.logprobs, ref.logprobs, atol=1e-6)
  np.testing.assert_array_equal(ro.truncated, ref.truncated)
  np.testing.assert_array_equal(ro.lengths, ref.lengths)
  assert float(jnp.sum(ro.env_mask)) == 0.0


def test_observations_follow_each_call_and_masks_are_exact(flat):
  graphdef, params = flat
  tokens, mask = _prompts()
  rec = Recorder()
  ro = _sampler(graphdef)(params, tokens, mask, jax.random.key(0), respond=rec)
  assert len(rec.calls) >= 10, "the flat model should end many calls"
  own, env = _expected_masks(ro, rec.calls)
  np.testing.assert_array_equal(ro.completion_mask, own)
  np.testing.assert_array_equal(ro.env_mask, env)
  comp = np.asarray(ro.completion)
  # Every observation is written right after its call, and nothing is both.
  assert not np.any((own > 0) & (env > 0))
  np.testing.assert_array_equal(comp[(own + env) == 0], PAD)
  for r, turn, obs in rec.calls:
    assert turn[-1] == STOP[0] and STOP[0] not in turn[:-1]
  np.testing.assert_array_equal(ro.lengths, own.sum(1))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_prefix", [False, True])
def test_behaviour_logprobs_equal_recomputed_forward_on_own_tokens(
  flat, plain, temperature, with_prefix
):
  """Aligned after the concatenation of prompt, prefix, observations and own tokens."""
  for graphdef, params in (flat, plain):
    tokens, mask = _prompts()
    B = tokens.shape[0]
    prefix = (
      (np.tile(np.asarray([[15, 16, 17]], np.int32), (B, 1)), np.arange(B) % 4)
      if with_prefix
      else None
    )
    ro = _sampler(graphdef, temperature)(
      params, tokens, mask, jax.random.key(2), respond=Recorder(), prefix=prefix
    )
    m = nnx.merge(graphdef, params)
    logits = m(ro.tokens[:, :-1], start=ro.start).logits[:, ro.prompt_len - 1 :]
    ref = models.gather_logprobs(logits / temperature, ro.completion)
    np.testing.assert_allclose(ro.logprobs, ref * ro.completion_mask, atol=2e-5)
    assert float(jnp.sum(jnp.abs(ro.logprobs) * ro.env_mask)) == 0.0


def test_end_stops_the_row_after_its_observation(flat):
  graphdef, params = flat
  tokens, mask = _prompts()
  rec = Recorder(end_after=1)
  ro = _sampler(graphdef)(params, tokens, mask, jax.random.key(0), respond=rec)
  own, env = np.asarray(ro.completion_mask), np.asarray(ro.env_mask)
  ended = {r for r, _, _ in rec.calls}
  assert ended and all(rec.count[r] == 1 for r in ended)
  for r in ended:
    last_own = np.flatnonzero(own[r])[-1]
    assert comp_at(ro, r, last_own) == STOP[0]
    assert np.all(own[r, last_own + 1 :] == 0)
    assert env[r, last_own + 1] == 1 or last_own + 1 == T
    fits = last_own + 1 + (r % 3 + 1) <= T
    assert not bool(ro.truncated[r]) or not fits


def comp_at(ro, r, t):
  return int(np.asarray(ro.completion)[r, t])


def test_prefix_is_inserted_before_the_first_turn(flat):
  graphdef, params = flat
  tokens, mask = _prompts()
  B = tokens.shape[0]
  lengths = np.arange(B) % 4  # 0 to 3 prefix tokens
  ids = np.tile(np.asarray([[15, 16, 17, 18]], np.int32), (B, 1))
  rec = Recorder()
  ro = _sampler(graphdef)(
    params, tokens, mask, jax.random.key(5), respond=rec, prefix=(ids, lengths)
  )
  comp = np.asarray(ro.completion)
  for b in range(B):
    np.testing.assert_array_equal(comp[b, : lengths[b]], ids[b, : lengths[b]])
  own, env = _expected_masks(ro, rec.calls, prefix_len=lengths)
  np.testing.assert_array_equal(ro.completion_mask, own)
  np.testing.assert_array_equal(ro.env_mask, env)
  for r, turn, _ in rec.calls:  # a turn never contains the prefix
    assert len(turn) >= 1 and turn[-1] == STOP[0]


def test_prefix_shifts_the_conditional_distribution(plain):
  """A prefix is read by the model: the first own token's log-prob differs with and without."""
  graphdef, params = plain
  tokens, mask = _prompts(3)
  s = _sampler(graphdef, temperature=0.0, stop=())
  a = s(params, tokens, mask, jax.random.key(0))
  b = s(
    params, tokens, mask, jax.random.key(0), prefix=(np.full((3, 2), 12, np.int32), np.full(3, 2))
  )
  assert not np.allclose(np.asarray(a.logprobs[:, 0]), np.asarray(b.logprobs[:, 2]))


def test_bad_insertions_are_refused(flat):
  graphdef, params = flat
  tokens, mask = _prompts()
  B = tokens.shape[0]
  with pytest.raises(ValueError, match="max_insert"):
    _sampler(graphdef, Q=2)(
      params,
      tokens,
      mask,
      jax.random.key(0),
      respond=lambda rows, turns: [([3, 3, 3], False)] * len(rows),
    )
  with pytest.raises(ValueError, match="prefix lengths"):
    _sampler(graphdef, Q=2)(
      params, tokens, mask, jax.random.key(0), prefix=(np.zeros((B, 2), np.int32), np.full(B, 3))
    )
  with pytest.raises(ValueError, match="answered"):
    _sampler(graphdef)(params, tokens, mask, jax.random.key(0), respond=lambda rows, turns: [])


def test_jit_programs_are_reused_across_calls_and_turns(flat):
  from posttrain_jax.bench import speed as bench

  graphdef, params = flat
  tokens, mask = _prompts()
  s = _sampler(graphdef)
  rec = Recorder()
  a = s(params, tokens, mask, jax.random.key(0), respond=rec)
  assert len(rec.calls) > 3  # many resumes of one compiled loop
  counter = bench.CompileCounter()
  b = s(params, tokens, mask, jax.random.key(0), respond=Recorder())
  np.testing.assert_array_equal(a.tokens, b.tokens)  # deterministic in its key
  assert counter.count == 0
