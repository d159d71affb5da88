"""The run's samplers: single-turn, or the inserting multi-turn loop when the run inserts tokens
into its rows (an active method's tool observations, ``Method.turns``, or prefixes,
``Method.prefix``; train/hooks.py).

:class:`InsertingSampler` runs the jitted multi-turn loop (rollout/multi_turn.py): a row stops
where it writes one of the turns' stop tokens, the method's responder answers, and the answer's
tokens are fed back into the row's KV cache; with bucket levels the batch's episodes are
scheduled in them (rollout.BucketScheduler: Libra's C-MLFQ). Without turns it only inserts
prefixes.

:func:`sample_texts` samples completions of a list of prompt texts in fixed-shape batches (the
SVEB benchmark's states, methods/pass_band/'s pass-rate annotation).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from posttrain_jax import rollout
from posttrain_jax.train import hooks


def inserts(ctx) -> bool:
  """Whether the run's samplers insert tokens: an active method's turns (tool observations) or
  prefixes (train/hooks.py)."""
  return bool(
    hooks.with_hook(ctx.methods, ctx.config, "turns")
    or hooks.with_hook(ctx.methods, ctx.config, "prefix")
  )


def turns_of(ctx, task):
  """The turns of the active method with a ``turns`` hook on ``task`` (at most one), or None."""
  for m in hooks.with_hook(ctx.methods, ctx.config, "turns"):
    return m.turns(ctx, task)
  return None


class InsertingSampler:
  """A sampler of rows into which tokens are inserted: ``sampler(params, tokens, mask, key,
  version=0, *, problems, prefix=None) -> Rollout`` (``problems``: one per row, for the turns'
  responder; ``prefix``: rollout.multi_turn's, e.g. DenoiseRL's). ``turns`` (a method's, e.g.
  methods/agent/'s ToolTurns; None: prefixes only) gives the stop tokens, the observation
  budget, the bucket levels and a responder per batch."""

  takes_problems = True

  def __init__(self, graphdef, cfg: rollout.SamplerConfig, *, turns=None, mesh=None):
    self.turns = turns
    # The widest insertion: an observation, or a prefix of up to the whole budget.
    self.Q = max(turns.obs_budget if turns is not None else 0, cfg.max_new_tokens)
    cfg = dataclasses.replace(cfg, prefill_group=0, decode_chunk=0)
    stop = turns.stop_ids if turns is not None else ()
    levels = turns.levels if turns is not None else ()
    spec = rollout.TurnConfig(stop, self.Q)
    self.fn = (
      rollout.BucketScheduler(graphdef, cfg, spec, levels, mesh=mesh)
      if levels
      else rollout.make_multi_turn_sampler(graphdef, cfg, spec, mesh=mesh)
    )

  def __call__(self, params, tokens, mask, key, version=0, *, problems=None, prefix=None):
    respond = None
    if self.turns is not None:
      respond = self.turns.responder(problems, tokens.shape[0])
    return self.fn(params, tokens, mask, key, version, respond=respond, prefix=prefix)


def sample(
  sampler, params, tokens, mask, key, version=0, *, problems, prefix=None, route_shift=None
):
  """``sampler``'s rollouts of the rows of ``problems`` (a single-turn sampler ignores them),
  continuing from ``prefix`` when given (an :class:`InsertingSampler` only), routed with
  ``route_shift`` when given (a single-turn sampler only: a method's ``route_shift`` hook)."""
  if getattr(sampler, "takes_problems", False):
    if route_shift is not None:
      raise ValueError("a routing shift needs the single-turn sampler (no tools, no prefixes)")
    return sampler(params, tokens, mask, key, version, problems=problems, prefix=prefix)
  if prefix is not None:
    raise ValueError(
      "a prefix needs the multi-turn sampler (a method's prefix hook or agent.tools)"
    )
  if route_shift is None:
    return sampler(params, tokens, mask, key, version)
  return sampler(params, tokens, mask, key, version, route_shift=route_shift)


def make_sampler(
  ctx, cfg: rollout.SamplerConfig, *, task=None, mesh=None, inserting: bool | None = None
):
  """The run's sampler of ``cfg``: an :class:`InsertingSampler` on ``task`` (default the run's
  env) when the run inserts tokens (:func:`inserts`; ``inserting`` overrides), else
  rollout.make_sampler's."""
  mesh = ctx.rollout_mesh if mesh is None else mesh
  if not (inserts(ctx) if inserting is None else inserting):
    return rollout.make_sampler(ctx.graphdef, cfg, mesh=mesh)
  turns = turns_of(ctx, ctx.env if task is None else task)
  return InsertingSampler(ctx.graphdef, cfg, turns=turns, mesh=mesh)


def sample_texts(ctx, sampler, params, texts, length, key, batch: int):
  """Completion ids [N, T] and their texts, in sampler calls of ``batch`` rows (the last one
  padded, one compiled shape)."""
  ids, out = [], []
  for i in range(0, len(texts), batch):
    chunk = texts[i : i + batch]
    padded = chunk + [chunk[-1]] * (batch - len(chunk))
    tokens, mask = rollout.encode_prompts(ctx.tokenizer, padded, length=length)
    ro = sampler(params, jnp.asarray(tokens), jnp.asarray(mask), jax.random.fold_in(key, i))
    completion = np.asarray(jax.device_get(ro.completion))[: len(chunk)]
    ids.append(completion)
    out.extend(rollout.decode_completions(ctx.tokenizer, completion))
  return np.concatenate(ids), out
