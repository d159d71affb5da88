"""Multi-turn tool use (``config.agent``; docs/agents.md): with ``agent.tools`` naming a tool,
every sampler of the run (the RL step's, ReMax's greedy baseline, the evaluation's) stops where
a row writes ``</tool>``, runs the call in a :class:`~posttrain_jax.envs.ToolEnv` and feeds the
observation back (:mod:`.tools`). Its ``METHODS`` entry: the config check and the ``turns`` hook
the engine's inserting sampler asks (train/samplers.py)."""

from posttrain_jax.envs import tool_calls
from posttrain_jax.methods.agent import tools
from posttrain_jax.methods.agent.fields import AGENT
from posttrain_jax.methods.agent.tools import ToolTurns
from posttrain_jax.registry import ConfigError
from posttrain_jax.train import hooks


def _require(cond: bool, msg: str) -> None:
  if not cond:
    raise ConfigError(msg)


def check(config) -> None:
  """Tools that exist with options they take, room for the cut mark, and the features that
  need the single-turn sampler off."""
  a = config.agent
  _require(
    isinstance(a.tools, (tuple, list)) and all(isinstance(t, str) for t in a.tools),
    f"config.agent.tools must be a tuple of tool names, e.g. ('calculator',), got {a.tools!r}",
  )
  tools.build_tools(a)
  tools.buckets(a)
  _require(
    a.max_obs_chars >= len(tool_calls.TRUNCATED),
    f"config.agent.max_obs_chars={a.max_obs_chars} leaves no room for the cut mark "
    f"{tool_calls.TRUNCATED!r}; use at least {len(tool_calls.TRUNCATED)}",
  )
  _require(
    not config.rl.routing_replay,
    "config.rl.routing_replay records routes in the single-turn sampler only; turn it "
    "off for multi-turn runs (config.agent.tools)",
  )
  _require(
    config.distributed.num_processes <= 1 and not config.distributed.coordinator_address,
    "multi-turn runs (config.agent.tools) run in one process: the host answers every "
    "row's tool calls; drop the distributed settings",
  )


def _turns(ctx, task):
  return ToolTurns(ctx.tokenizer, task, ctx.config.agent)


METHOD = hooks.Method(
  name="agent",
  section="agent",
  active=lambda config: bool(config.agent.tools),
  doc="docs/agents.md",
  check=check,
  turns=_turns,
  fields={"agent": AGENT},
)

__all__ = ["METHOD", "ToolTurns", "check", "tools"]
