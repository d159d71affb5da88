"""SAVE's online reward model in the RL run (``config.rl.save``; docs/save.md; the math is
:mod:`posttrain_jax.objectives.save_rm`).

The online RM is the ``reward_model`` stage's trained model with a two-column head on its
shared backbone: column 0 is the stage's reward head (``r(x, y)``, read at the response's last
valid token, as the stage reads it), column 1 a value head (``V(x)``, read at the prompt's last
token), started as a copy of the reward head (``value_init='reward_head'``, so ``V(x)`` starts
as the RM's score of the bare prompt) or fresh (normal, std 0.02; ``'fresh'``). It scores the
rollout's own tokens (left-padded prompt, completion), so the RM's tokenizer must be the
policy's (a stage started from the run's model has it).

Each RL step (train/rl_step.py): the current RM scores the step's rollouts, its normalised reward
``(r - mean) / std`` (the stage's held-out statistics) becomes the policy's reward, the policy
is updated, then one SAVE update of the RM on the same rollouts (mode ``save``: filtered pairs;
``no_filter``: every pair ordered by the advantage; ``frozen``: no update). The RM's train
state (parameters, optimiser state) is ``run_state['save_rm']``, checkpointed with the run,
and ``run_state['save_ref']`` holds the first step's statistics the hacking gap is measured in.
The run's verifier reward (the env's, hidden from the policy) is logged beside it:
``save/true_reward``, ``save/rm_reward``, ``save/rm_accuracy`` (pairwise, within groups, pairs
whose true rewards differ) and ``save/hacking_gap``.
"""

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posttrain_jax import models, parallel
from posttrain_jax.objectives import save_rm as save_math
from posttrain_jax.registry import ConfigError
from posttrain_jax.rewards import reward_model as rm_lib
from posttrain_jax.train import state as state_lib

MODES = ("save", "no_filter", "frozen")
VALUE_INITS = ("reward_head", "fresh")
REF_SIZE = 5  # save_ref: [set, rm mean, rm std, true mean, true std] of the first step


def enabled(cfg) -> bool:
  """Whether ``config.rl`` runs SAVE's online RM."""
  return bool(cfg.save.enabled)


def check(cfg) -> None:
  """ConfigErrors for a bad ``config.rl.save`` (names the key and the fix)."""
  s = cfg.save
  if not s.enabled:
    return
  if s.mode not in MODES:
    raise ConfigError(
      f"config.rl.save.mode={s.mode!r} is not one of {MODES} ('save': filtered "
      "pairs, 'no_filter': every pair ordered by A, 'frozen': no RM update)"
    )
  if s.objective not in save_math.OBJECTIVES:
    raise ConfigError(
      f"config.rl.save.objective={s.objective!r} is not one of {save_math.OBJECTIVES}"
    )
  if s.objective == "anchor" and s.mode == "no_filter":
    raise ConfigError(
      "config.rl.save.objective='anchor' needs the filter; use mode 'save' or objective 'pairs'"
    )
  if s.value_init not in VALUE_INITS:
    raise ConfigError(f"config.rl.save.value_init={s.value_init!r} is not one of {VALUE_INITS}")
  for key in ("k", "delta", "lr", "value_coef", "offline_coef"):
    if not float(s[key]) >= 0:
      raise ConfigError(f"config.rl.save.{key} must be >= 0, got {s[key]!r}")
  if cfg.scheduler.name != "none" or cfg.group_size < 2:
    raise ConfigError(
      "config.rl.save needs groups of G >= 2 consecutive rollouts per prompt: "
      "config.rl.scheduler.name='none' and config.rl.group_size >= 2"
    )
  if s.offline_coef and s.offline_batch < 1:
    raise ConfigError("config.rl.save.offline_batch must be >= 1 with offline_coef > 0")


@dataclasses.dataclass(frozen=True)
class OnlineRM:
  """The run's online RM: its graphdef, optimiser, the stage's normalisation, the jitted score
  and update functions, and the stage's pairs for the optional offline term."""

  graphdef: Any
  tx: Any
  mean: float
  std: float
  score: Callable  # (params, tokens, start, lengths) -> (r [B], v [B])
  update: Callable | None  # (state, batch) -> (state, metrics); None: frozen
  offline: Any = None  # train.reward_model.Encoded pairs, or None
  max_len: int = 0


def build_params(rm, value_init: str, seed: int):
  """``(graphdef, params)`` of the online RM from a loaded stage model ``rm``
  (rewards.reward_model.RewardModel): the trunk copied, head ``[D, 2]`` = (the stage's reward
  head, a value head that is a copy of it (``'reward_head'``) or fresh (normal, std 0.02))."""
  reward_head = rm.params["lm_head"][...]
  if value_init == "reward_head":
    value_head = reward_head
  else:
    value_head = 0.02 * jax.random.normal(
      jax.random.key(seed), reward_head.shape, reward_head.dtype
    )
  head = jnp.concatenate([reward_head, value_head], axis=1)
  graphdef, params = models.with_head(rm.graphdef, rm.params, head, seed)
  return graphdef, params


def rollout_heads(graphdef, params, tokens, start, lengths, prompt_len: int):
  """``(r [B], V [B])`` float32 of rollout tokens ``[B, S+T]`` (left-padded prompt of width
  ``prompt_len`` = S from ``start``, then the completion): the reward head (column 0) at the
  last completion token ``S + length - 1`` (the EOS when the row ended; its last token when
  truncated), the value head (column 1) at the prompt's last token ``S - 1``."""
  out = nnx.merge(graphdef, params)(tokens, start=start).logits
  index = jnp.clip(prompt_len + lengths.astype(jnp.int32) - 1, 0, tokens.shape[1] - 1)
  r = jnp.take_along_axis(out[..., 0], index[:, None], axis=1)[:, 0]
  return r.astype(jnp.float32), out[:, prompt_len - 1, 1].astype(jnp.float32)


def make_score_fn(graphdef, prompt_len: int) -> Callable:
  """Jitted ``(params, tokens, start, lengths) -> (r [B], V [B])`` (:func:`rollout_heads`)."""
  return jax.jit(lambda p, t, s, n: rollout_heads(graphdef, p, t, s, n, prompt_len))


def make_update(graphdef, tx, prompt_len: int, group_size: int, save_cfg) -> Callable:
  """Jitted ``update(state, batch) -> (state, metrics)``: one SAVE step on ``batch`` (tokens
  [B, S+T], start [B], lengths [B], valid [B]; B = P * G, G consecutive rows per prompt; with
  ``offline_coef``: the stage's pairs chosen / rejected [b, L] right-padded with their lengths)
  of ``save_loss + offline_coef * BT(offline pairs)``."""
  use_filter = save_cfg.mode != "no_filter"
  kw = dict(
    use_filter=use_filter,
    k=float(save_cfg.k),
    delta=float(save_cfg.delta),
    objective=str(save_cfg.objective),
    value_coef=float(save_cfg.value_coef),
  )
  offline_coef = float(save_cfg.offline_coef)

  def loss_fn(params, batch):
    r, v = rollout_heads(
      graphdef, params, batch["tokens"], batch["start"], batch["lengths"], prompt_len
    )
    rewards = r.reshape(-1, group_size)
    values = v.reshape(-1, group_size)[:, 0]  # every row of a group has the same prompt
    loss, metrics = save_math.save_loss(
      rewards, values, batch["valid"].reshape(-1, group_size), **kw
    )
    if offline_coef:
      tokens = jnp.concatenate([batch["chosen"], batch["rejected"]])
      lengths = jnp.concatenate([batch["chosen_len"], batch["rejected_len"]])
      out = nnx.merge(graphdef, params)(tokens).logits[..., 0]
      scores = rm_lib.read_scores(out, lengths)
      n = batch["chosen"].shape[0]
      offline, _ = rm_lib.bradley_terry_loss(scores[:n], scores[n:])
      loss = loss + offline_coef * offline
      metrics["save/offline_bt"] = offline
    return loss, metrics

  def update(state, batch):
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
    state, opt = state_lib.apply_gradients(state, grads, loss, tx)
    return state, {
      **metrics,
      "save/loss": loss,
      "save/grad_norm": opt["train/grad_norm"],
      "save/skipped": opt["train/skipped"],
    }

  return jax.jit(update, donate_argnums=(0,))


def build(ctx, seed: int):
  """``(OnlineRM, initial params)`` of the run's online RM, from the ``reward_model`` stage of
  ``config.rl.save.path`` (empty: this run's). ConfigError when the RM's tokenizer is not the
  policy's."""
  cfg = ctx.config.rl
  s = cfg.save
  rm = rm_lib.load(s.path, ctx.workdir)
  if rm.tokenizer.get_vocab() != ctx.tokenizer.get_vocab():
    raise ConfigError(
      f"config.rl.save: the reward model at {rm.path} has a tokenizer other "
      "than the policy's; SAVE scores the rollout's own tokens, so train the "
      "reward_model stage from this run's model (no reward_model.preset with "
      "another tokenizer)"
    )
  graphdef, params = build_params(rm, s.value_init, seed)
  tx = state_lib.make_optimizer(lr=float(s.lr), steps=cfg.steps, grad_clip=cfg.grad_clip)
  update = None
  if s.mode != "frozen":
    update = make_update(graphdef, tx, ctx.prompt_len, cfg.group_size, s)
  offline = None
  if s.offline_coef:
    from posttrain_jax.train import reward_model as stage  # pylint: disable=import-outside-toplevel

    offline = stage.Encoded(stage.load_pairs(ctx)[0], ctx.tokenizer, rm.max_len)
  online = OnlineRM(
    graphdef=graphdef,
    tx=tx,
    mean=float(rm.mean),
    std=max(float(rm.std), 1e-6),
    score=make_score_fn(graphdef, ctx.prompt_len),
    update=update,
    offline=offline,
    max_len=rm.max_len,
  )
  return online, params


def init_ref() -> jax.Array:
  """The empty first-step statistics (``save_ref``; set by the first scored step)."""
  return jnp.zeros((REF_SIZE,), jnp.float32)


def score_rollouts(
  online: OnlineRM, state: dict, ro, valid: np.ndarray, true_rewards, group_size: int
):
  """The step's scores by the current RM: ``(policy rewards [R] (device), SAVE batch, new
  save_ref, metrics)``. ``true_rewards``: the run's verifier rewards of the rows (logged, never
  given to the policy)."""
  start = ro.start
  r, v = online.score(state["save_rm"].params, ro.tokens, start, ro.lengths)
  norm = (r - online.mean) / online.std
  batch = {
    "tokens": ro.tokens,
    "start": start,
    "lengths": ro.lengths,
    "valid": jnp.asarray(valid, jnp.float32),
  }
  host_norm, host_v, true, ref = parallel.to_host((norm, v, true_rewards, state["save_ref"]))
  real = np.asarray(valid) > 0
  ref, metrics = rollout_metrics(
    host_norm, host_v, np.asarray(true), real, group_size, np.asarray(ref)
  )
  return norm, batch, jnp.asarray(ref), metrics


def _spread(x) -> float:
  std = float(np.std(x))
  return std if std > 1e-6 else 1.0


def rollout_metrics(norm, values, true, real, group_size: int, ref):
  """Host metrics of one step's scores and the (possibly first-set) reference statistics:
  ``save/rm_reward`` (normalised), ``save/true_reward``, ``save/value_mean``,
  ``save/rm_accuracy`` and ``save/rm_pairs`` (on-policy pairwise accuracy against the true
  reward), ``save/hacking_gap``: the RM reward's rise since the first step minus the true
  reward's, each in units of its first-step standard deviation (1 where that is 0, e.g. a
  0/1 verifier that no rollout passed)."""
  ref = np.array(ref, np.float32)
  rm_mean, true_mean = float(norm[real].mean()), float(true[real].mean())
  if ref[0] == 0:
    ref[:] = [1.0, rm_mean, _spread(norm[real]), true_mean, _spread(true[real])]
  acc, pairs = save_math.pairwise_accuracy(
    jnp.asarray(norm.reshape(-1, group_size)),
    jnp.asarray(true.reshape(-1, group_size)),
    jnp.asarray(real.reshape(-1, group_size).astype(np.float32)),
  )
  gap = (rm_mean - ref[1]) / ref[2] - (true_mean - ref[3]) / ref[4]
  return ref, {
    "save/rm_reward": rm_mean,
    "save/true_reward": true_mean,
    "save/value_mean": float(values[real].mean()),
    "save/rm_accuracy": float(acc),
    "save/rm_pairs": float(pairs),
    "save/hacking_gap": float(gap),
  }


def offline_batch(online: OnlineRM, size: int, key, pad_id: int) -> dict:
  """``size`` of the stage's training pairs drawn with ``key``, right-padded to the RM's
  ``max_len`` (the offline BT term's batch)."""
  index = np.asarray(jax.random.randint(key, (size,), 0, len(online.offline))).tolist()
  return online.offline.batch(index, online.max_len, pad_id)
