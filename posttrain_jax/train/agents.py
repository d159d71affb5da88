"""Multi-turn tool-use rollouts in the RL loop and the evaluation (``config.agent``; docs/agents.md).

With ``config.agent.tools`` set, every sampler of the run (the RL step's, ReMax's greedy
baseline, the evaluation's) is an :class:`AgentSampler`: the jitted multi-turn loop
(rollout/multi_turn.py) that stops where a row writes ``</tool>``, a :class:`~posttrain_jax.envs.
ToolEnv` per row that runs the call (the tools registry, envs/tools.py) and the observation's
tokens fed back into the row's KV cache. The final answer (the text after the last
observation) is scored like any completion, by the reward layer over the whole transcript:
the env's verifier reads the text after the last ``</obs>``.

Loss and log-probs: ``Rollout.completion_mask`` is the model's own tokens, ``env_mask`` the
observations, so the trainer's forward reads the observations and puts no loss on them.
"""

import concurrent.futures
import dataclasses

import numpy as np

from posttrain_jax import envs, rollout
from posttrain_jax.envs import tool_calls
from posttrain_jax.registry import ConfigError
from posttrain_jax.train import hooks


def enabled(config) -> bool:
  """Whether the run's rollouts are multi-turn (``config.agent.tools`` names a tool)."""
  return bool(tuple(config.agent.tools))


def inserts(ctx) -> bool:
  """Whether the run's samplers insert tokens: tool observations, or prefixes of an active
  method's ``prefix`` hook (train/hooks.py)."""
  return enabled(ctx.config) or bool(hooks.with_hook(ctx.methods, ctx.config, "prefix"))


def obs_tokens(agent_cfg) -> int:
  """Q, the observation budget in tokens: ``max_obs_tokens``, or 0: ``max_obs_chars`` plus the
  tags' characters (exact for a character tokenizer)."""
  if agent_cfg.max_obs_tokens:
    return int(agent_cfg.max_obs_tokens)
  return int(agent_cfg.max_obs_chars) + len(tool_calls.OBS_OPEN) + len(tool_calls.OBS_CLOSE)


def build_tools(agent_cfg) -> dict:
  """The run's tools (built once, shared by every row's env): ``agent.tools`` names with the
  options of ``agent.tool_kwargs[name]`` and the timeout ``agent.tool_timeout_s``."""
  options = agent_cfg.tool_kwargs.to_dict() if agent_cfg.tool_kwargs else {}
  unknown = sorted(set(options) - set(agent_cfg.tools))
  if unknown:
    raise ConfigError(
      f"config.agent.tool_kwargs names {unknown}, which are not in "
      f"config.agent.tools={list(agent_cfg.tools)}"
    )
  specs = {
    name: dict(options.get(name, {}), timeout_s=float(agent_cfg.tool_timeout_s))
    for name in agent_cfg.tools
  }
  return envs.make_tools(specs)


def buckets(agent_cfg) -> tuple:
  """``agent.buckets`` as :class:`~posttrain_jax.rollout.Bucket` levels (() for FIFO)."""
  spec = tuple(agent_cfg.get("buckets", ()) or ())
  form = "((width, quantum, calls[, refill]), ...), e.g. ((16, 512, 1, True), (8, 96, 0))"
  out = []
  for b in spec:
    if (
      not isinstance(b, (tuple, list))
      or len(b) not in (3, 4)
      or not all(isinstance(x, int) and not isinstance(x, bool) for x in b[:3])
      or (len(b) == 4 and not isinstance(b[3], bool))
    ):
      raise ConfigError(f"config.agent.buckets must be {form}, got {spec!r}")
    try:
      out.append(rollout.Bucket(*b))
    except ValueError as e:
      raise ConfigError(f"config.agent.buckets: {e}") from None
  return tuple(out)


def stop_ids(tokenizer) -> tuple[int, ...]:
  """The token ids of ``</tool>`` (the end of a call), which the loop stops on."""
  ids = tokenizer(tool_calls.TOOL_CLOSE, add_special_tokens=False)["input_ids"]
  if tokenizer.unk_token_id is not None and tokenizer.unk_token_id in ids:
    raise ConfigError(
      f"the tokenizer cannot encode {tool_calls.TOOL_CLOSE!r} (unknown "
      "characters): multi-turn runs need an env whose charset has the tool tags "
      "(e.g. long_mult), or a tokenizer that knows them"
    )
  return tuple(int(i) for i in ids)


class Responder:
  """``respond(rows, turns)`` of one batch (rollout.multi_turn.Respond): row ``r``'s turn text
  goes to ``envs_[r].step`` (rows concurrently, in threads), whose observation is encoded and
  cut to ``Q`` tokens; ``end`` is the env's ``done`` (the turn cap, the tool-failure cap)."""

  def __init__(self, envs_, tokenizer, Q: int, max_workers: int = 8):
    self.envs, self.tokenizer, self.Q, self.max_workers = envs_, tokenizer, Q, max_workers
    self.cut = 0  # observations cut to Q tokens

  def __call__(self, rows, turns):
    texts = self.tokenizer.batch_decode(
      [list(map(int, t)) for t in turns], skip_special_tokens=True
    )
    with concurrent.futures.ThreadPoolExecutor(min(self.max_workers, len(rows))) as pool:
      results = list(pool.map(lambda rt: self.envs[rt[0]].step(rt[1]), zip(rows, texts)))
    out = []
    for result in results:
      ids = self.tokenizer(result.observation, add_special_tokens=False)["input_ids"]
      self.cut += len(ids) > self.Q
      out.append((ids[: self.Q], result.done))
    return out


class AgentSampler:
  """A sampler of multi-turn tool-use episodes: ``sampler(params, tokens, mask, key, version=0,
  *, problems, prefix=None) -> Rollout`` (``problems``: one per row, each row's episode is
  ``ToolEnv.reset(problem)``; ``prefix``: rollout.multi_turn's, e.g. DenoiseRL's). Without
  tools (``agent_cfg.tools`` empty) it only inserts prefixes. With ``agent_cfg.buckets`` the
  batch's episodes are scheduled in those levels (rollout.BucketScheduler: Libra's C-MLFQ),
  else they run as one batch."""

  takes_problems = True

  def __init__(
    self, graphdef, cfg: rollout.SamplerConfig, tokenizer, task, agent_cfg, *, mesh=None, tools=None
  ):
    self.tokenizer, self.task, self.agent_cfg = tokenizer, task, agent_cfg
    self.tools = (
      (build_tools(agent_cfg) if tuple(agent_cfg.tools) else {}) if tools is None else tools
    )
    # The widest insertion: an observation, or a prefix of up to the whole budget.
    self.Q = max(obs_tokens(agent_cfg), cfg.max_new_tokens)
    cfg = dataclasses.replace(cfg, prefill_group=0, decode_chunk=0)
    stop = stop_ids(tokenizer) if self.tools else ()
    turns, levels = rollout.TurnConfig(stop, self.Q), buckets(agent_cfg) if self.tools else ()
    self.fn = (
      rollout.BucketScheduler(graphdef, cfg, turns, levels, mesh=mesh)
      if levels
      else rollout.make_multi_turn_sampler(graphdef, cfg, turns, mesh=mesh)
    )

  def _env(self, problem):
    a = self.agent_cfg
    env = envs.ToolEnv(
      self.task,
      self.tools,
      max_turns=int(a.max_turns),
      max_obs_chars=int(a.max_obs_chars),
      max_tool_failures=int(a.max_tool_failures) or None,
    )
    env.reset(problem)
    return env

  def __call__(self, params, tokens, mask, key, version=0, *, problems=None, prefix=None):
    respond = None
    if self.tools:
      if problems is None or len(problems) != tokens.shape[0]:
        raise ValueError(
          f"AgentSampler needs one problem per row ({tokens.shape[0]} rows), got "
          f"{None if problems is None else len(problems)}"
        )
      respond = Responder([self._env(p) for p in problems], self.tokenizer, self.obs_budget)
    return self.fn(params, tokens, mask, key, version, respond=respond, prefix=prefix)

  @property
  def obs_budget(self) -> int:
    return obs_tokens(self.agent_cfg)


def sample(sampler, params, tokens, mask, key, version=0, *, problems, prefix=None):
  """``sampler``'s rollouts of the rows of ``problems`` (a single-turn sampler ignores them),
  continuing from ``prefix`` when given (an :class:`AgentSampler` only)."""
  if getattr(sampler, "takes_problems", False):
    return sampler(params, tokens, mask, key, version, problems=problems, prefix=prefix)
  if prefix is not None:
    raise ValueError(
      "a prefix needs the multi-turn sampler (a method's prefix hook or agent.tools)"
    )
  return sampler(params, tokens, mask, key, version)


def make_sampler(
  ctx, cfg: rollout.SamplerConfig, *, task=None, mesh=None, inserting: bool | None = None
):
  """The run's sampler of ``cfg``: an :class:`AgentSampler` on ``task`` (default the run's env)
  when the run inserts tokens (``config.agent.tools``, a method's prefixes; ``inserting``
  overrides), else rollout.make_sampler's."""
  mesh = ctx.rollout_mesh if mesh is None else mesh
  if not (inserts(ctx) if inserting is None else inserting):
    return rollout.make_sampler(ctx.graphdef, cfg, mesh=mesh)
  return AgentSampler(
    ctx.graphdef, cfg, ctx.tokenizer, ctx.env if task is None else task, ctx.config.agent, mesh=mesh
  )


def call_counts(env_mask) -> np.ndarray:
  """[B] the number of observations inserted in each row (runs of 1 in ``env_mask`` [B, T])."""
  m = np.asarray(env_mask) > 0
  starts = m & ~np.pad(m, ((0, 0), (1, 0)))[:, :-1]
  return starts.sum(axis=1)


def error_counts(tokenizer, ro) -> np.ndarray:
  """[B] the number of error observations (``<obs>error: ...``) in each row."""
  comp, m = np.asarray(ro.completion), np.asarray(ro.env_mask) > 0
  texts = tokenizer.batch_decode(
    np.where(m, comp, tokenizer.pad_token_id), skip_special_tokens=True
  )
  return np.asarray([t.count(tool_calls.OBS_OPEN + "error:") for t in texts])


def metrics(tokenizer, ro, real=None, prefix="agent/") -> dict[str, float]:
  """Host metrics of a multi-turn batch over its ``real`` rows: ``tool_calls`` (calls per
  rollout), ``call_rate`` (rollouts with a call), ``tool_errors`` (error observations per
  rollout) and ``obs_tokens`` (observation tokens per rollout); {} for single-turn rollouts."""
  if ro.env_mask is None:
    return {}
  env_mask = np.asarray(ro.env_mask)
  real = np.ones(env_mask.shape[0], bool) if real is None else np.asarray(real) > 0
  calls = call_counts(env_mask)[real]
  errors = error_counts(tokenizer, ro)[real]
  n = max(int(real.sum()), 1)
  return {
    prefix + "tool_calls": float(calls.sum() / n),
    prefix + "call_rate": float((calls > 0).sum() / n),
    prefix + "tool_errors": float(errors.sum() / n),
    prefix + "obs_tokens": float(env_mask[real].sum() / n),
  }
