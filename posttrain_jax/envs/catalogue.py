"""The registry of environments: ``ENVS`` maps a name to an env instance (DESIGN.md section 4)."""

from posttrain_jax.envs.arithmetic import Arithmetic
from posttrain_jax.envs.chain import Chain
from posttrain_jax.envs.char_quota import CharQuota
from posttrain_jax.envs.code import Code
from posttrain_jax.envs.countdown import Countdown
from posttrain_jax.envs.digit_sum import DigitSum
from posttrain_jax.envs.grammar import Grammar
from posttrain_jax.envs.graph_path import GraphPath
from posttrain_jax.envs.instruct import Instruct, InstructConstraints
from posttrain_jax.envs.long_mult import LongMult
from posttrain_jax.envs.suite import MixedEnv, buckets, make_tasks
from posttrain_jax.envs.tom import ToM
from posttrain_jax.envs.welfare import Welfare
from posttrain_jax.registry import lookup

ENVS = {
  "arithmetic": Arithmetic(),
  "countdown": Countdown(),
  # The teacher papers' toys (issue 22): several correct answers per prompt, and feedback.
  "digit_sum": DigitSum(),
  "graph_path": GraphPath(),
  # Code checked by hidden tests in the sandbox (issue 23, rewards/sandbox.py).
  "code": Code(),
}

# The TRON-style suite (envs/suite): 'tron/<task>' single tasks, 'tron' the online mix of all of
# them, 'tron:<bucket>' the mix of one ability bucket, 'tron:no_<bucket>' all the others. SUITE maps a bucket to its task names.
_TASKS = make_tasks()
ENVS.update(_TASKS)
SUITE = buckets(_TASKS)
ENVS["tron"] = MixedEnv(list(_TASKS.values()), name="tron")
for _bucket, _names in SUITE.items():
  ENVS[f"tron:{_bucket}"] = MixedEnv([_TASKS[n] for n in _names], name=f"tron:{_bucket}")
  # Every task but this bucket's: train on it, evaluate generalisation on 'tron:<bucket>'.
  ENVS[f"tron:no_{_bucket}"] = MixedEnv(
    [t for n, t in _TASKS.items() if n not in _names], name=f"tron:no_{_bucket}"
  )

# Every character any task registered so far can emit: the vocabulary of runs on those tasks,
# frozen here so that registering a task with new characters (below) changes no earlier run.
CHARSET = "".join(sorted(set("".join(env.chars for env in ENVS.values()))))

# Tasks whose characters CHARSET does not hold (each gets CHARSET plus its own characters).
ENVS["grammar"] = Grammar()  # CME's toy (issue 23)
ENVS["instruct"] = Instruct()  # the rubric reward's toy (issue 23, rewards/rubric.py)
ENVS["instruct_constraints"] = InstructConstraints()  # its prompts, hard constraints only
ENVS["char_quota"] = CharQuota()  # SAVE's toy (issue 23): a reward model to exploit
ENVS["long_mult"] = LongMult()  # the tool-use toy (issue 24, envs/agent.py, docs/agents.md)
ENVS["chain"] = Chain()  # DenoiseRL's toy (issue 24): steps written out, wrong prefixes
# The primer's trace lengths at fixed correctness (experiments/primer_trace.py).
ENVS["chain_answer"] = Chain(trace="answer", name="chain_answer")
ENVS["chain_checked"] = Chain(trace="checked", name="chain_checked")
ENVS["welfare"] = Welfare()  # the functional-welfare axis's toy (issue 41): fresh maze symbols
ENVS["welfare_shuffled"] = Welfare("welfare_shuffled", shuffled=True)  # its control
# The ToM toy (issue 24, envs/tom.py): false-belief stories; the shortcut split, a counterbalanced
# one, held-out third-order questions and counterfactual edits.
ENVS["tom"] = ToM("tom", "counterbalanced")
ENVS["tom_shortcut"] = ToM("tom_shortcut", "shortcut")
ENVS["tom_order3"] = ToM("tom_order3", "order3")
ENVS["tom_counterfactual"] = ToM("tom_counterfactual", "counterfactual")
ENVS["tom_think"] = ToM("tom_think", "counterbalanced", thinking=True)  # corpus: reasoning traces
ENVS["tom_shortcut_think"] = ToM("tom_shortcut_think", "shortcut", thinking=True)
for _split, _kind in (("tom", "counterbalanced"), ("tom_shortcut", "shortcut")):
  for _ablation in ("question", "no_presence", "final_state"):  # the audit's ablated inputs
    ENVS[f"{_split}/{_ablation}"] = ToM(f"{_split}/{_ablation}", _kind, ablation=_ablation)
# The characters of the first two tasks: the vocabulary of every arithmetic / countdown run, kept
# as it was before the suite existed so those runs (and their checkpoints) stay unchanged.
CORE_CHARSET = "".join(sorted(set(Arithmetic.chars + Countdown.chars)))


def tokenizer_charset(name: str) -> str:
  """The characters a new run on env ``name`` builds its char tokenizer from: the core set when
  the env's characters fit in it, else :data:`CHARSET` when they fit in that, else
  :data:`CHARSET` plus the env's own."""
  chars = set(get_env(name).chars)
  if chars <= set(CORE_CHARSET):
    return CORE_CHARSET
  return "".join(sorted(set(CHARSET) | chars))


def get_env(name: str):
  """``ENVS[name]``, or a ConfigError (a ValueError) listing the valid names."""
  return lookup(ENVS, name, "env")
