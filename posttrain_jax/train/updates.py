"""Jitted steps: supervised (pretrain/SFT) and the RL update of DESIGN.md section 3, step 7.

Each factory closes over the static pieces (model graph, optimiser, loss settings) and returns a
``jax.jit`` function over ``(state, batch, key)`` with the state donated.
"""

import dataclasses
import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from posttrain_jax import models, objectives, parallel
from posttrain_jax.train import loss_terms
from posttrain_jax.train.state import TrainState, apply_gradients


class CompletionForward(NamedTuple):
  """What :func:`completion_forward` returns.

  Attributes:
    logprobs: [B, T] float32 log-probs of the completion tokens.
    logits: [B, T, V] float32 logits that predict them (divided by the temperature).
    aux_loss: MoE: the unweighted load-balancing loss of the forward (float32); else None.
    aux_coef: the model's ``router_aux_loss_coef`` (a Python float; 0 for dense models).
    routing: with ``return_routing`` (MoE): [B, L, S+T-1, k] int32 experts the forward used
      (rows first, as ``Rollout.routes``); else None.
    prefix_mismatch: with ``group`` (the shared-prompt forward): [] int32, the number of rows
      whose prompt tokens or start differ from their group's first row (0 when the batch is
      laid out as that forward assumes); else None.
  """

  logprobs: jax.Array
  logits: jax.Array
  aux_loss: jax.Array | None
  aux_coef: float
  routing: jax.Array | None = None
  prefix_mismatch: jax.Array | None = None


def replay_routing(routes: jax.Array | None) -> jax.Array | None:
  """The ``routing`` [L, B, S+T-1, k] a forward over ``tokens[:, :-1]`` replays, from a
  rollout's rows-first ``routes`` [B, L, S+T, k] (None stays None)."""
  return None if routes is None else jnp.swapaxes(routes[:, :, :-1], 0, 1)


def completion_forward(
  graphdef,
  params,
  tokens: jax.Array,
  start: jax.Array,
  prompt_len: int,
  *,
  temperature: float = 1.0,
  routes: jax.Array | None = None,
  return_routing: bool = False,
  group: int = 0,
  completion_mask: jax.Array | None = None,
) -> CompletionForward:
  """The forward over ``tokens[:, :-1]`` ([B, S+T] int32); positions ``S-1 ..`` predict the
  completion. ``routes`` [B, L, S+T, k] (``Rollout.routes``, MoE only): recorded experts to
  replay (routing replay; -1 entries are routed afresh). ``completion_mask`` [B, T] (MoE
  only): the completion tokens its load-balancing loss counts with the real prompt tokens
  (default: every position from the row's start, the padding after EOS included).

  ``group`` > 1: rows ``g*group .. (g+1)*group - 1`` share one prompt (a GRPO batch as the
  sampler lays it out) and the prompt's forward runs once per group
  (``models.grouped_forward``; the same logits, fewer FLOPs); ``prefix_mismatch`` counts rows
  that break that layout.
  """
  model = nnx.merge(graphdef, params)
  mismatch = None
  if group > 1:
    if routes is not None or return_routing:
      raise ValueError(
        "the shared-prompt forward (group > 1) does not record or replay MoE routing; use group=0"
      )
    S = prompt_len
    prompts, prompt_start = tokens[::group, :S], start[::group]
    mismatch = jnp.sum(
      jnp.any(tokens[:, :S] != jnp.repeat(prompts, group, axis=0), axis=1)
    ) + jnp.sum(start != jnp.repeat(prompt_start, group))
    out = models.grouped_forward(model, prompts, prompt_start, tokens[:, S:-1], group)
    logits = out.logits
  else:
    token_mask = None
    if completion_mask is not None and model.config.num_experts:
      # Input position S + j holds completion token j (j < T - 1); the prompt's are kept and
      # cut to the real ones from ``start`` by the model.
      token_mask = jnp.concatenate(
        [
          jnp.ones((tokens.shape[0], prompt_len), jnp.float32),
          completion_mask[:, :-1].astype(jnp.float32),
        ],
        axis=1,
      )
    out = model(
      tokens[:, :-1],
      start=start,
      routing=replay_routing(routes),
      return_routing=return_routing,
      token_mask=token_mask,
    )
    logits = out.logits[:, prompt_len - 1 :]
  logits = parallel.constrain(logits, ("batch", "act_length", "act_vocab"))
  if temperature not in (0.0, 1.0):
    logits = logits / temperature
  logprobs = models.gather_logprobs(logits, tokens[:, prompt_len:])
  coef = float(model.config.router_aux_loss_coef) if model.config.num_experts else 0.0
  routing = None if out.routing is None else jnp.swapaxes(out.routing, 0, 1)
  return CompletionForward(logprobs, logits, out.aux_loss, coef, routing, mismatch)


def sequence_logprobs(
  graphdef,
  params,
  tokens: jax.Array,
  start: jax.Array,
  prompt_len: int,
  *,
  temperature: float = 1.0,
  routes: jax.Array | None = None,
  group: int = 0,
):
  """Log-probs of the completion tokens. ``tokens`` [B, S+T] -> ([B, T] f32, [B, T, V] logits).

  The forward runs over ``tokens[:, :-1]``; positions ``S-1 ..`` predict the completion.
  ``routes``: recorded MoE routing to replay; ``group``: the shared-prompt forward (see
  :func:`completion_forward`).
  """
  fwd = completion_forward(
    graphdef, params, tokens, start, prompt_len, temperature=temperature, routes=routes, group=group
  )
  return fwd.logprobs, fwd.logits


def jit_step(
  step: Callable,
  shardings,
  n_args: int,
  extra_shardings: tuple = (),
  *,
  name: str = "step",
  static: tuple = (),
) -> Callable:
  """``jax.jit(step)`` with the state (argument 0) donated.

  With ``shardings`` (train.placement.StepShardings): explicit in/out shardings (state as
  placed, batch rows over the batch axes, the last ``len(extra_shardings)`` arguments as given
  (e.g. a frozen base model's parameter shardings), everything else after the batch
  replicated), activations constrained while tracing, and arguments placed before the call (a
  no-op when they lie so already). Without: a plain jit, as on one device.
  ``name`` and ``static`` (what ``step`` closes over beyond the run's config) key the compiled
  step in the installed store of compiled programs (``parallel.executables``), if any.
  """
  jit = functools.partial(parallel.executables.jit, name=name, static=static)
  if shardings is None:
    return jit(step, donate_argnums=(0,))
  s = shardings

  def constrained(state, batch, *rest):
    with parallel.activation_sharding(s.mesh, s.rules):
      return step(state, parallel.constrain_rows(batch), *rest)

  in_shardings = (
    (s.state, s.batch)
    + (s.replicated,) * (n_args - 2 - len(extra_shardings))
    + tuple(extra_shardings)
  )
  fn = jit(
    constrained,
    in_shardings=in_shardings,
    out_shardings=(s.state, s.replicated),
    donate_argnums=(0,),
  )

  def call(state, batch, *rest):
    return fn(*parallel.put((state, batch) + rest, in_shardings))

  return call


# ----------------------------------------------------------------------------------------------
# Supervised: masked next-token loss.
# ----------------------------------------------------------------------------------------------
def supervised_nll(graphdef, params, tokens, loss_mask) -> jax.Array:
  """The mean negative log-likelihood of ``tokens`` [B, L] over the positions whose
  ``loss_mask`` is 1 (aligned with ``tokens``; the first token is never predicted)."""
  model = nnx.merge(graphdef, params)
  logits = model(tokens[:, :-1]).logits
  nll = -models.gather_logprobs(logits, tokens[:, 1:])
  return objectives.masked_mean(nll, loss_mask[:, 1:])


def make_sft_step(graphdef, tx, *, shardings=None, max_update_ratio: float = 0.0) -> Callable:
  """``step(state, batch) -> (state, metrics)``; batch has ``tokens`` and ``loss_mask`` [B, L].

  The loss is the mean negative log-likelihood of tokens whose ``loss_mask`` is 1 (the mask is
  aligned with ``tokens``; the first token is never predicted). ``shardings``: see
  :func:`jit_step`. A non-finite or exploding update (``max_update_ratio``, see
  :func:`~posttrain_jax.train.state.apply_gradients`) is skipped.
  """

  def loss_fn(params, batch):
    loss = supervised_nll(graphdef, params, batch["tokens"], batch["loss_mask"])
    return loss, {"loss/nll": loss, "data/tokens": jnp.sum(batch["loss_mask"][:, 1:])}

  def step(state: TrainState, batch):
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
    state, opt_metrics = apply_gradients(state, grads, loss, tx, max_update_ratio)
    return state, {**metrics, **opt_metrics}

  return jit_step(step, shardings, 2, name="train.sft_step", static=(graphdef, max_update_ratio))


# ----------------------------------------------------------------------------------------------
# RL: epochs x minibatches of a named policy loss + KL to a reference + entropy bonus.
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RLLossConfig:
  """Static settings of the RL loss (hashable).

  Attributes:
    policy_loss: name in objectives.POLICY_LOSSES.
    policy_loss_kwargs: sorted (name, value) pairs passed to it.
    aggregation: name in objectives.AGGREGATIONS.
    norm_length: constant length for ``seq_mean_token_sum_norm`` (None = T).
    kl_coef: initial weight of the KL-to-reference term; 0 removes the term (the live value
      comes from the KL controller through ``controls['kl_coef']``).
    kl_estimator: name in objectives.KL_ESTIMATORS, or ``full_forward`` / ``full_reverse``
      (its keywords: ``kl_estimator_kwargs``, sorted (name, value) pairs)
    kl_aggregation: ``token_mean`` or ``policy`` (the KL term averages with ``aggregation``).
    kl_bias_correction: the KL term's per-token estimate times the ratio π/π_old.
      (exact KL over the vocabulary from the reference logits).
    kl_in_reward: the KL penalty goes into the reward instead of the loss.
    entropy_coef: weight of the entropy bonus (subtracted from the loss); negative: entropy
      minimisation (e.g. to collapse a policy on purpose).
    temperature: sampling temperature; the trainer scales logits by it too.
    epochs: passes over the batch.
    minibatches: updates per pass.
    dcmdp: add DCMDP's λ (D̂ - δ) with λ and δ from ``controls['dcmdp_lam']`` and
      ``controls['dcmdp_delta']``.
    aux_loss: name in objectives.AUX_LOSSES, or '' for none.
    aux_loss_kwargs: sorted (name, value) pairs passed to it.
    num_groups: prompts per step (group-aware terms).
    step_delimiters: token ids that end a reasoning step (EchoRL clips).
    beta_from_controls: pass ``beta=controls['hpo_beta']`` to the policy loss (A-HPO's
      controller setting HPO's negative weight).
    loss_reads_group: pass ``group`` [b] and ``num_groups`` to the policy loss (HPO's group
      mean-length normalisation).
    group: rollouts per prompt when every ``group`` consecutive rows share their prompt (the
      sampler's layout): the forward runs each prompt once (:func:`completion_forward`) and
      reports ``train/prefix_mismatch``, and minibatches are drawn as whole groups; 0: the
      full forward, minibatches drawn as rows.
    mismatch_in_loss: compute the train-inference mismatch metrics (``mismatch/*``) from the
      loss's own log-probs; the update reports those of its first minibatch, whose parameters
      are still the ones the batch was built with (exact with one minibatch). Set when nothing
      else needs a separate trainer forward, which is then skipped.
    max_update_ratio: an update whose global norm exceeds this times the parameters' is
      skipped as exploding (0: off); non-finite ones always are.
    distill: name in objectives.DIVERGENCES (the teacher's distillation term), or '' for
      none; weighted by ``controls['distill_coef']``, the policy loss then by
      ``controls['pg_coef']`` (the teacher method sets both per step).
    distill_kwargs: sorted (name, value) pairs passed to it.
    sft_beta: RL+SFT parallel averaging, ``beta * L_RL + (1 - beta) * L_CE`` with ``L_CE`` the
      cross-entropy of the batch's supervised rows (``sft_tokens``); 1: off.
  """

  policy_loss: str = "ppo_clip"
  policy_loss_kwargs: tuple = ()
  aggregation: str = "token_mean"
  norm_length: int | None = None
  kl_coef: float = 0.0
  kl_estimator: str = "k3"
  kl_estimator_kwargs: tuple = ()
  kl_aggregation: str = "token_mean"
  kl_bias_correction: bool = False
  kl_in_reward: bool = False
  entropy_coef: float = 0.0
  temperature: float = 1.0
  epochs: int = 1
  minibatches: int = 1
  dcmdp: bool = False
  aux_loss: str = ""
  aux_loss_kwargs: tuple = ()
  num_groups: int = 1
  step_delimiters: tuple = ()
  beta_from_controls: bool = False
  loss_reads_group: bool = False
  mismatch_in_loss: bool = False
  group: int = 0
  max_update_ratio: float = 0.0
  distill: str = ""
  distill_kwargs: tuple = ()
  sft_beta: float = 1.0

  @property
  def kl_in_loss(self) -> bool:
    return bool(self.kl_coef) and not self.kl_in_reward


def rl_loss(params, batch, controls: dict, *, graphdef, prompt_len: int, cfg: RLLossConfig):
  """Scalar RL loss and metrics on one minibatch: the policy loss, then each active term of
  ``loss_terms.LOSS_TERMS`` in the table's order.

  ``batch``: a ``train.inputs.TrainBatch`` of ``b`` rows; its optional fields are set when a
  selected piece reads them (``ref_logprobs`` for the KL term, ``ref_logits`` [b, T, V] for the
  exact KL, ``routes`` [b, L, S+T, k] for routing replay, any field the policy loss declares
  with ``registry.reads``, passed to it by name). ``controls``: scalars set by controllers (kl_coef,
  dcmdp_lam, hpo_beta). A mixture-of-experts model's load-balancing loss is always added,
  weighted by its ``router_aux_loss_coef`` (logged unweighted as ``moe/aux_loss``), over the
  real prompt tokens and the completion tokens under ``mask`` (not the padding after EOS).
  """
  fwd = completion_forward(
    graphdef,
    params,
    batch.tokens,
    batch.start,
    prompt_len,
    temperature=cfg.temperature,
    routes=batch.routes,
    group=cfg.group,
    completion_mask=batch.mask,
  )
  logprobs, logits = fwd.logprobs, fwd.logits
  mask = batch.mask
  policy_loss = objectives.lookup(objectives.POLICY_LOSSES, cfg.policy_loss, "policy loss")
  kwargs = dict(cfg.policy_loss_kwargs)
  # The batch fields the loss declares (registry.reads), e.g. teacher or reference log-probs.
  kwargs.update({f: getattr(batch, f) for f in sorted(getattr(policy_loss, "reads", ()))})
  if cfg.beta_from_controls:
    kwargs["beta"] = controls["hpo_beta"]
  if cfg.loss_reads_group:
    kwargs.update(group=batch.group, num_groups=cfg.num_groups)
  loss, metrics = policy_loss(
    logprobs,
    batch.old_logprobs,
    batch.advantages,
    mask,
    aggregation=cfg.aggregation,
    norm_length=cfg.norm_length,
    weights=batch.is_weights,
    **kwargs,
  )
  metrics = dict(metrics)
  sft_nll = None
  if batch.sft_tokens is not None:  # supervised rows beside the RL rows (a loss term reads it)
    sft_nll = supervised_nll(graphdef, params, batch.sft_tokens, batch.sft_mask)
  x = loss_terms.TermInputs(
    logprobs, logits, objectives.entropy_from_logits(logits), batch, mask, fwd, prompt_len, sft_nll
  )
  for term in loss_terms.LOSS_TERMS.values():  # the named terms, in the table's order
    if term.active(cfg):
      loss, term_metrics = term.apply(loss, x, controls, cfg)
      metrics.update(term_metrics)
  metrics["loss/total"] = loss
  return loss, metrics


def make_rl_update(
  graphdef,
  tx,
  prompt_len: int,
  cfg: RLLossConfig,
  *,
  shardings=None,
  view: Callable | None = None,
  frozen_shardings=None,
) -> Callable:
  """``update(state, batch, controls, key[, frozen]) -> (state, metrics)``: ``epochs x
  minibatches``.

  Each epoch draws a fresh permutation from ``fold_in(key, epoch)`` (of the rows, or with
  ``cfg.group`` > 1 of whole groups, so every minibatch keeps the shared-prompt layout); metrics are averaged over
  the updates, except ``train/skipped`` and ``train/nonfinite`` which are summed.
  ``shardings``: see :func:`jit_step`.
  With ``view`` (e.g. LoRA): ``state.params`` are only the trainable parameters, the model runs
  on ``view(state.params, frozen)`` and gradients reach the trainable ones only; ``frozen`` (the
  base parameters, not donated) is placed with ``frozen_shardings``.
  """

  def loss(p, b, c, frozen):
    full = p if view is None else view(p, frozen)
    return rl_loss(full, b, c, graphdef=graphdef, prompt_len=prompt_len, cfg=cfg)

  grad_fn = jax.value_and_grad(loss, has_aux=True)

  def update(state: TrainState, batch, controls: dict, key: jax.Array, frozen=None):
    rows = batch.tokens.shape[0]
    if rows % cfg.minibatches:
      raise ValueError(f"batch of {rows} rows does not split into {cfg.minibatches} minibatches")
    size = rows // cfg.minibatches
    G = cfg.group if cfg.group > 1 else 1  # rows kept together by the permutation
    if rows % G or (rows // G) % cfg.minibatches:
      raise ValueError(
        f"the shared-prompt forward keeps groups of {G} rows whole: {rows} rows "
        f"do not split into {cfg.minibatches} minibatches of whole groups"
      )

    def one(state, i):
      if cfg.minibatches == 1:  # the whole batch, in order (the loss does not see the order)
        mb = batch
      else:  # a permutation of the rows, or of whole groups with the shared-prompt forward
        epoch, j = i // cfg.minibatches, i % cfg.minibatches
        units = rows // G
        perm = jax.random.permutation(jax.random.fold_in(key, epoch), units)
        take = jax.lax.dynamic_slice(perm, (j * (size // G),), (size // G,))
        idx = (take[:, None] * G + jnp.arange(G)[None, :]).reshape(-1)
        mb = parallel.constrain_rows(jax.tree.map(lambda x: x[idx], batch))
      (loss, metrics), grads = grad_fn(state.params, mb, controls, frozen)
      state, opt_metrics = apply_gradients(state, grads, loss, tx, cfg.max_update_ratio)
      return state, {**metrics, **opt_metrics}

    state, metrics = jax.lax.scan(one, state, jnp.arange(cfg.epochs * cfg.minibatches))
    out = {k: jnp.mean(v) for k, v in metrics.items()}
    for k in ("train/skipped", "train/nonfinite"):  # counts of skipped updates
      out[k] = jnp.sum(metrics[k])
    for k in metrics:  # measured before any update of this batch: the first minibatch's
      if k.startswith("mismatch/"):
        out[k] = metrics[k][0]
    return state, out

  site = dict(name="train.rl_update", static=(graphdef, prompt_len, cfg, view is None))
  if view is None:
    return jit_step(update, shardings, 4, **site)
  return jit_step(update, shardings, 5, (frozen_shardings,), **site)


def make_advantage_fn(name: str, kwargs: tuple, num_groups: int) -> Callable:
  """Jitted ``fn(inputs: AdvantageInputs) -> (advantages [B] or [B, T], metrics)``."""
  fn = objectives.lookup(objectives.ADVANTAGES, name, "advantage")
  return parallel.executables.jit(
    lambda inputs: fn(inputs, num_groups=num_groups, **dict(kwargs)),
    name="train.advantages",
    static=(name, kwargs, num_groups),
  )


def make_logprob_fn(
  graphdef, prompt_len: int, temperature: float, *, with_logits: bool = False, group: int = 0
) -> Callable:
  """Jitted ``fn(params, tokens, start, routes=None) -> [B, T]`` completion log-probs (e.g. the
  reference), or ``([B, T], [B, T, V] logits)`` with ``with_logits``; ``routes`` [B, L, S+T, k]:
  recorded MoE routing to replay; ``group`` > 1: every ``group`` consecutive rows share their
  prompt, whose forward runs once (see :func:`completion_forward`)."""

  def fn(p, t, s, r):
    logprobs, logits = sequence_logprobs(
      graphdef, p, t, s, prompt_len, temperature=temperature, routes=r, group=group
    )
    return (logprobs, logits) if with_logits else logprobs

  jitted = parallel.executables.jit(
    fn, name="train.logprobs", static=(graphdef, prompt_len, temperature, with_logits, group)
  )
  return lambda p, t, s, routes=None: jitted(p, t, s, routes)


def make_hidden_fn(graphdef, prompt_len: int) -> Callable:
  """Jitted ``fn(params, tokens [B, S+T], start) -> [B, T, D]`` float32: the last layer's
  residual stream at the position before each completion token (the state the token is
  sampled from; Hista's input)."""

  def fn(p, tokens, start):
    out = nnx.merge(graphdef, p)(tokens[:, :-1], start=start, return_hidden_states=True)
    return out.hidden_states[-1][:, prompt_len - 1 :].astype(jnp.float32)

  return parallel.executables.jit(fn, name="train.hidden", static=(graphdef, prompt_len))


def make_routing_overlap_fn(graphdef, prompt_len: int) -> Callable:
  """Jitted ``fn(params, tokens, start, routes, mask) -> []`` float32: the mean
  ``models.moe.routing_overlap`` between the recorded ``routes`` [B, L, S+T, k] and the experts
  this model picks itself (a fresh forward, no replay), over the layers and the positions that
  were recorded (no -1) and are real: prompt tokens from ``start`` on and completion tokens
  under ``mask`` [B, T]. 1 when the trainer would route every token as the sampler did."""

  def fn(p, tokens, start, routes, mask):
    fresh = completion_forward(
      graphdef, p, tokens, start, prompt_len, return_routing=True
    ).routing  # [B, L, S+T-1, k]
    recorded = routes[:, :, :-1]
    overlap = models.moe.routing_overlap(recorded, fresh)  # [B, L, S+T-1]
    position = jnp.arange(tokens.shape[1] - 1)[None, :]
    real = jnp.concatenate(
      [
        (position[:, :prompt_len] >= start[:, None]).astype(jnp.float32),
        mask[:, :-1].astype(jnp.float32),
      ],
      axis=1,
    )  # [B, S+T-1]
    seen = jnp.all(recorded >= 0, axis=-1).astype(jnp.float32) * real[:, None, :]
    return jnp.sum(overlap * seen) / jnp.maximum(jnp.sum(seen), 1.0)

  return jax.jit(fn)
