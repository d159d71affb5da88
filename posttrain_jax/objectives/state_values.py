"""State values of partial responses from the other rollouts of the group: Numca and Hista
(SVEB, arXiv 2605.29782; methods_B.md section 12). Every formula here is *derived* from the
abstracts (the section says so); each is one function, easy to change.

For rollout ``i`` of prompt ``x`` with reward ``R_i`` and completion tokens ``t``, a state value
``V(s_{i,t})`` is an average of the rewards of the *other* rollouts of the group (leave-one-out:
``R_i`` never enters ``V(s_{i,t})``), and the token advantage is ``A_{i,t} = R_i - V(s_{i,t})``.

- Numca (numbers as states): the state token ``t`` is sampled from is the key of the numbers
  the rollout completed *before* it (``milestones`` [B, T] int32 holds the key after each token,
  ``-1`` before the first number, made from the completion text by ``milestone_keys``; the
  state of token ``t`` is ``milestones[t - 1]``, so a token's own number never enters its
  baseline). ``V(s_{i,t}) = mean_{j != i: key in keys(j)} R_j``
  over the group's rollouts that reached the same state; the key carries forward between
  milestones; a token with no milestone yet, or whose state no other rollout reached, gets the
  leave-one-out group mean.
- Hista (hidden states as states): ``h_{i,t}`` [D] L2-normalised, kernel
  ``k = exp(cos(h_{i,t}, h_{j,t'}) / tau)`` over the real tokens ``t'`` of the other rollouts
  ``j != i`` of the group (optionally only the ``top_m`` largest per token),
  ``V(s_{i,t}) = sum k R_j / sum k``. Cost O((B T)^2 D) per batch: toys only, or subsample.

A rollout alone in its group has no other rollout to average: its value is its own reward and
its advantage 0 (no signal, as GRPO's flat group).

Shapes: ``B`` rollouts, ``T`` completion tokens, ``D`` hidden width.
"""

import re
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from posttrain_jax.objectives.advantage_inputs import (
  AdvantageInputs,
  _require,
  _row_metrics,
  _token_mask,
)
from posttrain_jax.registry import adapts, reads

NO_STATE = -1
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def milestone_keys(pieces: list[list[str]], lengths) -> np.ndarray:
  """[B, T] int32 Numca state keys of completions given as their tokens' texts ``pieces[b]``
  (T each, ``lengths[b]`` real): at every token, a key of the numbers completed so far (a number
  is completed at the token holding its last character, when the text after it does not go on
  with a digit or the completion ends); ``NO_STATE`` before the first. *[derived: the abstract
  says "numbers in responses as state representation"; the key is the sequence of numbers so
  far.]*"""
  B = len(pieces)
  T = max((len(p) for p in pieces), default=0)
  out = np.full((B, T), NO_STATE, np.int32)
  for b, row in enumerate(pieces):
    n = int(lengths[b])
    text = "".join(row[:n])
    ends = np.cumsum([len(x) for x in row[:n]])  # token t holds characters [ends[t-1], ends[t])
    numbers, key = [], NO_STATE
    done = {}  # token index -> key after the numbers completed in it
    for m in NUMBER.finditer(text):
      numbers.append(m.group())
      token = int(np.searchsorted(ends, m.end() - 1, side="right"))
      done[token] = zlib.crc32(" ".join(numbers).encode()) & 0x7FFFFFFF
    for t in range(n):
      key = done.get(t, key)
      out[b, t] = key
  return out


def _others(group: jax.Array, valid: jax.Array) -> jax.Array:
  """[B, B] float32: 1 where ``j`` is another valid rollout of ``i``'s group."""
  same = group[:, None] == group[None, :]
  other = ~jnp.eye(group.shape[0], dtype=bool)
  return (same & other & (valid[None, :] > 0)).astype(jnp.float32)


def loo_group_mean(rewards: jax.Array, group: jax.Array, valid: jax.Array) -> jax.Array:
  """[B] the mean reward of each rollout's other valid rollouts in its group (its own reward
  when it is alone): the GRPO / RLOO baseline as a state value."""
  mean, n = _loo_mean(rewards, _others(group, valid))
  return jnp.where(n > 0, mean, rewards)


def _loo_mean(rewards: jax.Array, others: jax.Array) -> tuple[jax.Array, jax.Array]:
  """([B] leave-one-out group mean, [B] count of the other rollouts)."""
  n = jnp.sum(others, axis=1)
  return jnp.sum(others * rewards[None, :], axis=1) / jnp.maximum(n, 1.0), n


def state_before(milestones: jax.Array) -> jax.Array:
  """[B, T] the Numca state each token is sampled from: the key after the previous token
  (``NO_STATE`` for the first)."""
  first = jnp.full(milestones.shape[:1] + (1,), NO_STATE, milestones.dtype)
  return jnp.concatenate([first, milestones[:, :-1]], axis=1)


def numca_values(
  rewards: jax.Array,
  group: jax.Array,
  valid: jax.Array,
  milestones: jax.Array,
  mask: jax.Array,
) -> jax.Array:
  """[B, T] Numca state values (module docstring): rewards [B], group [B], valid [B],
  milestones [B, T] int32 keys after each token (``NO_STATE`` before the first number),
  mask [B, T]; token ``t``'s value is that of the state ``milestones[t - 1]``."""
  return numca_values_matched(rewards, group, valid, milestones, mask)[0]


def numca_values_matched(rewards, group, valid, milestones, mask) -> tuple[jax.Array, jax.Array]:
  """(:func:`numca_values`, [B, T] float32 1 where another rollout reached the token's state:
  the value is not the leave-one-out group mean's fallback)."""
  others = _others(group, valid)
  loo, n = _loo_mean(rewards, others)
  state = state_before(milestones)  # [B, T] the state each token is sampled from
  real = (mask > 0) & (state != NO_STATE)
  seen = (mask > 0) & (milestones != NO_STATE)  # the states each rollout reached
  # reached[i, t, j]: rollout j reached the state of (i, t)
  hit = state[:, :, None, None] == milestones[None, None, :, :]  # [B, T, B, T]
  reached = jnp.any(hit & seen[None, None, :, :], axis=-1).astype(jnp.float32)  # [B, T, B]
  reached = reached * others[:, None, :]
  count = jnp.sum(reached, axis=-1)  # [B, T]
  value = jnp.sum(reached * rewards[None, None, :], axis=-1) / jnp.maximum(count, 1.0)
  matched = real & (count > 0)
  value = jnp.where(matched, value, loo[:, None])
  value = jnp.where((n > 0)[:, None], value, rewards[:, None]) * mask
  return value, (matched & (n > 0)[:, None]).astype(jnp.float32) * mask


def hista_values(
  rewards: jax.Array,
  group: jax.Array,
  valid: jax.Array,
  hidden: jax.Array,
  mask: jax.Array,
  *,
  tau: float = 0.1,
  top_m: int = 0,
) -> jax.Array:
  """[B, T] Hista state values (module docstring): hidden [B, T, D] (e.g. the policy's last
  layer), ``tau`` the kernel temperature, ``top_m`` > 0 keeps each token's ``top_m`` most
  similar other-rollout tokens."""
  B, T, _ = hidden.shape
  h = hidden.astype(jnp.float32)
  h = h / jnp.maximum(jnp.linalg.norm(h, axis=-1, keepdims=True), 1e-12)
  logits = jnp.einsum("itd,jsd->itjs", h, h) / tau  # [B, T, B, T]
  allowed = (_others(group, valid)[:, None, :, None] > 0) & (mask[None, None, :, :] > 0)
  logits = jnp.where(allowed, logits, -jnp.inf)
  flat = logits.reshape(B, T, B * T)
  if top_m and top_m < B * T:
    kth = jax.lax.top_k(flat, top_m)[0][..., -1:]
    flat = jnp.where(flat >= kth, flat, -jnp.inf)
  some = jnp.any(jnp.isfinite(flat), axis=-1)  # [B, T]
  weights = jax.nn.softmax(jnp.where(some[..., None], flat, 0.0), axis=-1)
  returns = jnp.broadcast_to(rewards[:, None], (B, T)).reshape(B * T)
  value = jnp.einsum("itk,k->it", weights, returns)
  return jnp.where(some, value, rewards[:, None]) * mask


def token_advantages(rewards: jax.Array, values: jax.Array, mask: jax.Array) -> jax.Array:
  """``A_{i,t} = R_i - V(s_{i,t})`` on real tokens, 0 elsewhere."""
  return (rewards[:, None] - values) * mask


def _finish(inputs: AdvantageInputs, values: jax.Array, mask: jax.Array, name: str):
  rewards = jnp.where(inputs.valid > 0, inputs.rewards, 0.0)
  adv = token_advantages(rewards, values, mask)
  metrics = _row_metrics(adv, mask)
  metrics[f"adv/{name}_value_mean"] = jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)
  return adv, metrics


@reads("milestones")
@adapts(numca_values, fills=("rewards", "group", "valid", "milestones", "mask"))
def _numca_entry(inputs: AdvantageInputs, *, num_groups):
  del num_groups
  milestones = _require(inputs, "milestones", "numca", "[B, T] int32 number-state keys")
  mask = _token_mask(inputs, "numca") * (inputs.valid[:, None] > 0)
  rewards = jnp.where(inputs.valid > 0, inputs.rewards, 0.0)
  values, matched = numca_values_matched(rewards, inputs.group, inputs.valid, milestones, mask)
  adv, metrics = _finish(inputs, values, mask, "numca")
  metrics["adv/numca_matched"] = jnp.sum(matched) / jnp.maximum(jnp.sum(mask), 1.0)
  return adv, metrics


@reads("hidden")
@adapts(hista_values, fills=("rewards", "group", "valid", "hidden", "mask"))
def _hista_entry(inputs: AdvantageInputs, *, num_groups, tau=0.1, top_m=0):
  del num_groups
  hidden = _require(inputs, "hidden", "hista", "[B, T, D] last-layer hidden states")
  mask = _token_mask(inputs, "hista") * (inputs.valid[:, None] > 0)
  rewards = jnp.where(inputs.valid > 0, inputs.rewards, 0.0)
  values = hista_values(rewards, inputs.group, inputs.valid, hidden, mask, tau=tau, top_m=top_m)
  return _finish(inputs, values, mask, "hista")


ADVANTAGES = {"numca": _numca_entry, "hista": _hista_entry}
