import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posttrain_jax import models, rollout

EOS, PAD, V = 1, 0, 19


@pytest.fixture(scope="module")
def model():
  cfg = models.preset("nano", vocab_size=V)
  return models.Decoder(cfg, rngs=nnx.Rngs(0))


def _prompts():
  ids = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [4]]
  tokens, mask = rollout.left_pad(ids, PAD)
  return jnp.asarray(np.repeat(tokens, 8, 0)), jnp.asarray(np.repeat(mask, 8, 0))


def _flat_model(model):
  """Same graph with a zero final norm: uniform next-token distribution, EOS often."""
  graphdef, params = nnx.split(model)
  params = jax.tree.map(lambda x: x, params)
  params["final_norm"][...] = jnp.zeros_like(params["final_norm"][...])
  return graphdef, params


def _recomputed_logprobs(graphdef, params, ro, temperature):
  m = nnx.merge(graphdef, params)
  logits = m(ro.tokens[:, :-1], start=ro.start).logits[:, ro.prompt_len - 1 :]
  return models.gather_logprobs(logits / temperature, ro.completion)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_equal_recomputed_forward(model, temperature):
  graphdef, params = nnx.split(model)
  cfg = rollout.SamplerConfig(max_new_tokens=10, eos_id=EOS, pad_id=PAD, temperature=temperature)
  tokens, mask = _prompts()
  ro = rollout.make_sampler(graphdef, cfg)(params, tokens, mask, jax.random.key(0))
  ref = _recomputed_logprobs(graphdef, params, ro, temperature)
  np.testing.assert_allclose(ro.logprobs, ref * ro.completion_mask, atol=2e-5)
  assert ro.logprobs.dtype == jnp.float32


def test_eos_handling_and_masks(model):
  graphdef, params = _flat_model(model)
  T = 12
  cfg = rollout.SamplerConfig(max_new_tokens=T, eos_id=EOS, pad_id=PAD)
  tokens, mask = _prompts()
  ro = rollout.make_sampler(graphdef, cfg)(params, tokens, mask, jax.random.key(3))
  comp, cmask = np.asarray(ro.completion), np.asarray(ro.completion_mask)
  np.testing.assert_array_equal(np.asarray(ro.tokens[:, : tokens.shape[1]]), tokens)
  saw_eos = saw_trunc = False
  for b in range(comp.shape[0]):
    eos = np.flatnonzero(comp[b] == EOS)
    if eos.size:
      saw_eos = True
      e = eos[0]
      assert eos.size == 1 and not ro.truncated[b]
      np.testing.assert_array_equal(cmask[b], np.arange(T) <= e)
      np.testing.assert_array_equal(comp[b, e + 1 :], PAD)
      assert ro.lengths[b] == e + 1
    else:
      saw_trunc = True
      assert ro.truncated[b] and ro.lengths[b] == T and cmask[b].all()
  assert saw_eos and saw_trunc
  np.testing.assert_array_equal(np.asarray(ro.logprobs)[cmask == 0], 0.0)


def test_greedy_equals_top_k_one_and_is_deterministic(model):
  graphdef, params = nnx.split(model)
  tokens, mask = _prompts()
  greedy = rollout.make_sampler(graphdef, rollout.SamplerConfig(8, EOS, PAD, temperature=0.0))
  topk1 = rollout.make_sampler(graphdef, rollout.SamplerConfig(8, EOS, PAD, top_k=1))
  a = greedy(params, tokens, mask, jax.random.key(0))
  b = topk1(params, tokens, mask, jax.random.key(5))
  np.testing.assert_array_equal(a.tokens, b.tokens)
  # Rows with the same prompt decode identically under greedy.
  np.testing.assert_array_equal(a.tokens[0], a.tokens[7])


def test_left_padded_prompt_samples_like_unpadded(model):
  graphdef, params = nnx.split(model)
  cfg = rollout.SamplerConfig(6, EOS, PAD, temperature=0.0)
  sample = rollout.make_sampler(graphdef, cfg)
  t1, m1 = rollout.left_pad([[5, 6, 7]], PAD, bucket=False)
  t2, m2 = rollout.left_pad([[5, 6, 7]], PAD, length=16)
  a = sample(params, t1, m1, jax.random.key(0)).completion
  b = sample(params, t2, m2, jax.random.key(0)).completion
  np.testing.assert_array_equal(a, b)


def test_filter_logits_matches_numpy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(4, 10)).astype(np.float32)
  out = np.asarray(rollout.filter_logits(jnp.asarray(logits), top_k=0, top_p=0.6))
  for row, kept in zip(logits, out):
    p = np.exp(row) / np.exp(row).sum()
    order = np.argsort(-p)
    cum = np.cumsum(p[order]) - p[order]
    keep = set(order[cum < 0.6].tolist())
    assert {i for i in range(10) if np.isfinite(kept[i])} == keep
  out = np.asarray(rollout.filter_logits(jnp.asarray(logits), top_k=3, top_p=1.0))
  assert all(np.isfinite(r).sum() == 3 for r in out)


@pytest.mark.parametrize("flat", [False, True])
def test_chunked_decode_equals_one_loop(model, flat):
  """Chunks of 4 steps over T = 11 (caches of S+4, S+8, S+11) sample the same tokens with the
  same log-probs as one loop over the full cache; with EOS (flat) rows stop inside chunks."""
  graphdef, params = _flat_model(model) if flat else nnx.split(model)
  tokens, mask = _prompts()
  out = {}
  for chunk in (0, 4, 64):
    cfg = rollout.SamplerConfig(max_new_tokens=11, eos_id=EOS, pad_id=PAD, decode_chunk=chunk)
    out[chunk] = rollout.make_sampler(graphdef, cfg)(params, tokens, mask, jax.random.key(5))
  for chunk in (4, 64):
    np.testing.assert_array_equal(out[chunk].tokens, out[0].tokens)
    np.testing.assert_array_equal(out[chunk].completion_mask, out[0].completion_mask)
    np.testing.assert_allclose(out[chunk].logprobs, out[0].logprobs, atol=1e-5)
  assert not flat or np.any(np.asarray(out[4].lengths) < 11)


def test_bad_sampler_config():
  with pytest.raises(ValueError, match="top_p"):
    rollout.SamplerConfig(4, EOS, PAD, top_p=0.0)
  with pytest.raises(ValueError, match="decode_chunk"):
    rollout.SamplerConfig(4, EOS, PAD, decode_chunk=-1)
  with pytest.raises(ValueError, match="does not fit"):
    rollout.left_pad([[1] * 9], PAD, length=8)


@pytest.mark.parametrize("chunk, group", [(0, 0), (3, 0), (4, 8)])
def test_greedy_sampler_equals_reference_greedy_decode(model, chunk, group):
  """The sampler (decode cache, fused projections, chunked cache, shared prefill) picks the
  tokens of a plain greedy loop over the reference full forward (no cache): each step the
  argmax of the full forward's last logits."""
  graphdef, params = nnx.split(model)
  T = 6
  tokens, mask = _prompts()
  tokens, mask = tokens[::4], mask[::4]  # 6 rows: every 2 share a prompt
  cfg = rollout.SamplerConfig(
    T, EOS, PAD, temperature=0.0, decode_chunk=chunk, prefill_group=group and 2
  )
  ro = rollout.make_sampler(graphdef, cfg)(params, tokens, mask, jax.random.key(0))
  start = jnp.asarray(tokens.shape[1] - np.sum(np.asarray(mask), 1), jnp.int32)
  forward = jax.jit(lambda seq: model(seq, start=start).logits[:, -1])
  seq, done = tokens, np.zeros(tokens.shape[0], bool)
  want = np.full((tokens.shape[0], T), PAD)
  for t in range(T):
    nxt = np.asarray(jnp.argmax(forward(seq), axis=-1))
    want[:, t] = np.where(done, PAD, nxt)
    done |= nxt == EOS
    seq = jnp.concatenate([seq, jnp.asarray(nxt, jnp.int32)[:, None]], axis=1)
  np.testing.assert_array_equal(np.asarray(ro.completion), want)


def test_greedy_breaks_exact_ties_by_the_lowest_token_id():
  # A tie is broken the same way on every machine and every batch layout: the first maximum.
  from posttrain_jax.rollout.sampler import SamplerConfig, sample_token

  logits = jnp.array([[0.0, 2.0, 2.0, -1.0], [5.0, 5.0, 5.0, 5.0], [-jnp.inf, 1.0, 0.0, 1.0]])
  cfg = SamplerConfig(max_new_tokens=1, eos_id=0, pad_id=0, temperature=0.0)
  for fn in (sample_token, jax.jit(sample_token, static_argnums=2)):
    tokens, _ = fn(jax.random.key(0), logits, cfg)
    assert tokens.tolist() == [1, 0, 1]
    # the same rows in another order and batch size pick the same tokens
    flipped, _ = fn(jax.random.key(0), logits[::-1][:2], cfg)
    assert flipped.tolist() == [1, 0]
