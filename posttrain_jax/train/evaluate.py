"""Held-out evaluation: greedy accuracy, sampled pass@1 and unbiased pass@k, length, truncation.

In a multi-process run every process calls the evaluator (the samplers are SPMD programs), the
completions are gathered to every process and each scores all of them (the same numbers).
"""

import dataclasses

import jax
import numpy as np

from posttrain_jax import objectives, parallel, rollout
from posttrain_jax.rewards import outcomes
from posttrain_jax.train import samplers


@dataclasses.dataclass
class Evaluator:
  """Evaluates parameters on a fixed list of held-out problems.

  Attributes:
    problems: the held-out problems (greedy accuracy uses all of them).
    env: the environment whose ``verify`` scores completions.
    tokenizer: the tokenizer.
    greedy: a sampler (rollout.make_sampler) with temperature 0.
    sampled: a sampler with the evaluation temperature.
    prompt_len: S, the padded prompt length.
    batch_size: rows per sampler call (the last chunk is padded, so one shape compiles).
    pass_k: K of pass@K.
    pass_n: samples per problem for pass@K (n >= K).
    pass_problems: how many of the problems get ``pass_n`` samples.
    prompt_texts: maps problems to the prompt texts (e.g. with a chat template); default
      ``problem.prompt``.
    cast: maps the parameters to the deployed copy before sampling (e.g. fake-int8 weights
      from rollout.make_inference_cast); identity by default.
    prefix: of every metric name (``eval/accuracy``, ...; ``eval/heldout_`` for a held-out env).
    scorer: the run's :class:`~posttrain_jax.rewards.Scorer`: every ``env.verify`` call runs
      through it (worker processes, timeout); a failed call scores 0 and is counted in
      ``<prefix>reward/errors/<kind>`` (counts of calls of this evaluation, greedy and
      sampled); above ``config.reward.max_error_rate`` of them the run stops.
    env_label: names the env in reward messages.
  """

  problems: list
  env: object
  tokenizer: object
  greedy: object
  sampled: object
  prompt_len: int
  batch_size: int
  pass_k: int
  pass_n: int
  pass_problems: int
  scorer: object
  env_label: str
  cast: object = None
  prompt_texts: object = None
  prefix: str = "eval/"

  def _run(self, sampler, params, problems, key) -> tuple[np.ndarray, ...]:
    """(scores [N], failure codes [N], lengths [N], truncated [N], texts [N], tool calls [N]
    (None for single-turn samplers)) of one completion per problem."""
    scores, lengths, truncs, all_texts, calls = [], [], [], [], []
    for i in range(0, len(problems), self.batch_size):
      chunk = problems[i : i + self.batch_size]
      padded = chunk + [chunk[-1]] * (self.batch_size - len(chunk))
      texts = self.prompt_texts(padded) if self.prompt_texts else [p.prompt for p in padded]
      tokens, mask = rollout.encode_prompts(self.tokenizer, texts, length=self.prompt_len)
      out = samplers.sample(
        sampler, params, tokens, mask, jax.random.fold_in(key, i), problems=padded
      )
      completion, length, trunc = parallel.to_host((out.completion, out.lengths, out.truncated))
      texts = rollout.decode_completions(self.tokenizer, completion)
      n = len(chunk)
      scores.append(self.scorer.score(self.env, chunk, texts[:n], env=self.env_label))
      lengths.append(length[:n])
      truncs.append(trunc[:n])
      all_texts.extend(texts[:n])
      turns = getattr(sampler, "turns", None)  # a method's multi-turn episodes (tool use)
      if out.env_mask is not None and turns is not None:
        calls.append(turns.call_counts(parallel.to_host(out.env_mask))[:n])
    rewards, codes = (np.concatenate(x) for x in zip(*scores))
    return (
      rewards,
      codes,
      np.concatenate(lengths),
      np.concatenate(truncs),
      all_texts,
      np.concatenate(calls) if calls else None,
    )

  def scores(self, params, problems, key) -> np.ndarray:
    """Per-problem greedy rewards [len(problems)] of ``params`` on ``problems`` (any list, e.g.
    training problems; the weight-space search scores each perturbed policy so). A failed
    reward call scores 0 and counts against ``config.reward.max_error_rate``."""
    if self.cast is not None:
      params = self.cast(params)
    scores, codes, *_ = self._run(self.greedy, params, problems, key)
    self.scorer.check(codes, where="search scoring", env=self.env_label)
    return scores

  def __call__(self, params, key) -> dict[str, float]:
    """Metrics (with ``prefix``): ``accuracy`` (greedy), ``len_mean``, ``truncated``, with
    ``pass_n`` also ``pass@1``, ``pass@K`` and ``distinct_correct`` (the mean number of
    distinct correct completions among a problem's ``pass_n`` samples: diversity), and the
    failed reward calls by kind."""
    if self.cast is not None:
      params = self.cast(params)
    scores, codes, lengths, truncs, _, calls = self._run(self.greedy, params, self.problems, key)
    failures = [codes]
    out = {
      "accuracy": float(scores.mean()),
      "len_mean": float(lengths.mean()),
      "truncated": float(truncs.mean()),
    }
    if calls is not None:  # multi-turn: greedy tool calls per problem, problems with a call
      out.update(tool_calls=float(calls.mean()), call_rate=float((calls > 0).mean()))
    if self.pass_n:
      subset = self.problems[: self.pass_problems]
      repeated = [p for p in subset for _ in range(self.pass_n)]
      s, codes, _, _, texts, _ = self._run(
        self.sampled, params, repeated, jax.random.fold_in(key, 1 << 20)
      )
      failures.append(codes)
      correct = (s.reshape(len(subset), self.pass_n) > 0).sum(axis=1)
      out["distinct_correct"] = distinct_correct(s, texts, self.pass_n)
      n = np.full(len(subset), self.pass_n)
      out["pass@1"] = float(objectives.pass_at_k(n, correct, 1).mean())
      out[f"pass@{self.pass_k}"] = float(objectives.pass_at_k(n, correct, self.pass_k).mean())
    failures = np.concatenate(failures)
    out.update(outcomes.counts(failures))
    self.scorer.check(failures, where=f"evaluation ({self.prefix}*)", env=self.env_label)
    return {self.prefix + k: v for k, v in out.items()}


def distinct_correct(scores, texts, n: int) -> float:
  """The mean over problems of the number of distinct (whitespace-stripped) completions that
  scored > 0 among each problem's ``n`` consecutive samples (``scores`` [P*n], ``texts``)."""
  per_problem = []
  for i in range(0, len(texts), n):
    per_problem.append(
      len({t.strip() for t, s in zip(texts[i : i + n], scores[i : i + n]) if s > 0})
    )
  return float(np.mean(per_problem)) if per_problem else 0.0
