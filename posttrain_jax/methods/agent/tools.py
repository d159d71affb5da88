"""Multi-turn tool use in the RL loop and the evaluation (``config.agent``; docs/agents.md): the
run's tools, the budget and stop tokens of a turn, the responder that runs each row's calls in a
:class:`~posttrain_jax.envs.ToolEnv`, Libra's bucket levels, and the episodes' metrics.

:class:`ToolTurns` is what the engine's inserting sampler (train/samplers.py) asks of the method:
the tokens a turn stops on, the observation budget, the bucket levels and a responder per batch.
The final answer (the text after the last observation) is scored like any completion: the env's
verifier reads the text after the last ``</obs>``. Loss and log-probs: ``Rollout.completion_mask``
is the model's own tokens, ``env_mask`` the observations, so the trainer's forward reads the
observations and puts no loss on them.
"""

import concurrent.futures

import numpy as np

from posttrain_jax import envs, rollout
from posttrain_jax.envs import tool_calls
from posttrain_jax.registry import ConfigError


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


class ToolTurns:
  """The turns of the run's tool-use episodes on ``task``: ``stop_ids`` (``</tool>``), the
  observation budget ``obs_budget`` (tokens), Libra's ``levels`` (``agent.buckets``; () for
  FIFO), ``responder(problems, rows)`` (one ``ToolEnv.reset(problem)`` per row) and the
  episodes' ``metrics`` / ``call_counts``."""

  def __init__(self, tokenizer, task, agent_cfg, tools=None):
    self.tokenizer, self.task, self.agent_cfg = tokenizer, task, agent_cfg
    self.tools = build_tools(agent_cfg) if tools is None else tools
    self.stop_ids = stop_ids(tokenizer)
    self.obs_budget = obs_tokens(agent_cfg)
    self.levels = buckets(agent_cfg)

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

  def responder(self, problems, rows: int) -> "Responder":
    if problems is None or len(problems) != rows:
      raise ValueError(
        f"a tool-use sampler needs one problem per row ({rows} rows), got "
        f"{None if problems is None else len(problems)}"
      )
    return Responder([self._env(p) for p in problems], self.tokenizer, self.obs_budget)

  def metrics(self, ro, real=None) -> dict:
    return metrics(self.tokenizer, ro, real)

  @staticmethod
  def call_counts(env_mask) -> np.ndarray:
    return call_counts(env_mask)
