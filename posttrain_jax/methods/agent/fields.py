"""Multi-turn tool use, ``config.agent`` (methods/agent/, docs/agents.md)."""

from posttrain_jax.fields import Field, Section, free  # noqa: F401

AGENT = Section(
  'multi-turn tool use (methods/agent/, docs/agents.md)',
  unused=(
    (
      (
        "agent.tool_kwargs",
        "agent.max_turns",
        "agent.max_obs_chars",
        "agent.max_obs_tokens",
        "agent.max_tool_failures",
        "agent.tool_timeout_s",
        "agent.buckets",
      ),
      lambda c: not tuple(c.agent.tools),
      "config.agent.tools is empty (single-turn rollouts)",
    ),
  ),
  stage='pretrain',
  fields=dict(
    buckets=Field(
      (),
      "multi-turn runs: Libra's C-MLFQ levels `((width, quantum, calls[, refill]), ...)`: a batch of a level runs up to `width` episodes for `quantum` tokens; an episode is demoted to the next level after `calls` tool returns (0: never on calls) or its quantum, and continues from its transcript (recompute); `refill=True`: continuous batching, a freed row takes the next fresh episode; `()`: each batch runs to its end (FIFO) ([agents.md](agents.md), [libra.md](libra.md))",
      stage='rl',
    ),
    max_obs_chars=Field(
      32,
      "multi-turn runs: an observation's text budget in characters (cut with `...(cut)`; at least 8)",
      kind='count',
    ),
    max_obs_tokens=Field(
      0,
      "an observation's token budget (0: `max_obs_chars` plus the tags' 11 characters, exact for a character tokenizer); a longer observation is cut to it",
      kind='count0',
    ),
    max_tool_failures=Field(
      0,
      'failed calls (parse errors, raised, timed out, non-text) that end an episode; 0: no cap',
      kind='count0',
    ),
    max_turns=Field(
      4,
      'turns per episode, the final answer included: a call on the last turn ends the row after its observation',
      kind='count',
    ),
    tool_kwargs=free(
      'tool name -> its options, e.g. `{"python": {"cpu_s": 1.0}}` (checked against the tool\'s signature)'
    ),
    tool_timeout_s=Field(
      10.0,
      'seconds per tool call; a call that overruns is answered `error: NAME: timed out after T s`',
      kind='positive',
    ),
    tools=Field(
      (),
      "multi-turn tool-use rollouts when it names a tool (`envs.TOOLS` names, `'module:function'`, `'path/file.py:function'`): every sampler of the run (RL, ReMax's baseline, evaluation) stops where a row writes `</tool>`, runs the call and feeds the observation back, with no loss on it ([agents.md](agents.md)); `()`: single-turn",
    ),
  ),
)
