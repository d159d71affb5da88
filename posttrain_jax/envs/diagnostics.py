"""Substrate diagnostics for generator-verifier environments (TRON, arXiv 2606.01599).

The TRON paper reports, besides training results, a *substrate analysis*: generation
reliability, instance and level diversity, cross-environment near-duplicates and the base
model's pass rate by difficulty level. Each has a function here, all host-side:

- ``generation_reliability``: how many generator calls raise, and how many instances are
  invalid (answer does not verify, wrong split/level, prompt or answer over the declared length,
  characters outside ``env.chars``, or the same key not giving the same instances);
- ``instance_diversity``: distinct prompts and (prompt, answer) pairs among n samples;
- ``near_duplicates``: prompt pairs from *different* envs whose character n-gram Jaccard
  similarity reaches a threshold (exact duplicates counted apart);
- ``verifier_consistency``: the generator's answer verifies to 1 and perturbed answers to 0;
- ``pass_rate_by_level`` + ``falls_with_level``: a ``solve(prompts) -> completions`` hook (a
  model's greedy decoder, or ``noisy_oracle``) scored per env and level.

``run`` gathers them and ``report_markdown`` renders the result (scripts/env_diagnostics.py).
"""

import hashlib
from collections.abc import Callable, Mapping, Sequence

import jax
import numpy as np
from scipy import sparse

from posttrain_jax.envs import base

Solve = Callable[[list[str]], list[str]]


def base_envs(registry: Mapping) -> dict:
  """The registry without mixtures (an env with an ``envs`` member dict is a mixture)."""
  return {name: env for name, env in registry.items() if not hasattr(env, "envs")}


def _instance_problems(env, p: base.Problem, level: int, split: str) -> list[str]:
  errors = []
  if env.verify(p, p.answer) != 1.0:
    errors.append("own answer does not verify")
  if p.level != level:
    errors.append(f"level {p.level} != {level}")
  if base.split_of(p.uid, env.eval_percent) != split:
    errors.append("uid hashes to the other split")
  if len(p.prompt) > env.max_prompt_chars(level):
    errors.append(f"prompt longer than {env.max_prompt_chars(level)}")
  if len(p.answer) > env.max_answer_chars(level):
    errors.append(f"answer longer than {env.max_answer_chars(level)}")
  if not set(p.prompt + p.answer) <= set(env.chars):
    errors.append(
      f"characters outside env.chars: {sorted(set(p.prompt + p.answer) - set(env.chars))}"
    )
  return errors


def generation_reliability(
  env,
  *,
  seeds: Sequence[int] = range(20),
  n: int = 20,
  levels: Sequence[int] | None = None,
  splits: Sequence[str] = base.SPLITS,
) -> dict[int, dict]:
  """Per level: generator ``calls``, ``call_failures`` (exceptions), ``instances``,
  ``invalid`` instances, ``reliability`` = valid instances / requested, ``errors`` (examples)."""
  out = {}
  for level in levels or env.levels:
    stats = {"calls": 0, "call_failures": 0, "instances": 0, "invalid": 0, "errors": []}
    for seed in seeds:
      for split in splits:
        key = jax.random.fold_in(jax.random.key(seed), level)
        stats["calls"] += 1
        try:
          problems = env.sample(key, n, level=level, split=split)
          again = env.sample(key, n, level=level, split=split)
        except Exception as e:  # pylint: disable=broad-except
          stats["call_failures"] += 1
          stats["errors"].append(f"seed {seed} {split}: {type(e).__name__}: {e}")
          continue
        if [p.uid for p in problems] != [p.uid for p in again]:
          stats["errors"].append(f"seed {seed} {split}: same key gave different instances")
          stats["invalid"] += len(problems)
        if len(problems) != n:
          stats["errors"].append(f"seed {seed} {split}: {len(problems)} problems, asked {n}")
        for p in problems:
          stats["instances"] += 1
          errors = _instance_problems(env, p, level, split)
          if errors:
            stats["invalid"] += 1
            stats["errors"].append(f"{p.prompt!r}: {'; '.join(errors)}")
    requested = stats["calls"] * n
    stats["reliability"] = (stats["instances"] - stats["invalid"]) / max(requested, 1)
    stats["errors"] = stats["errors"][:5]
    out[level] = stats
  return out


def instance_diversity(env, level: int, *, n: int = 1000, key=None, split: str = "train") -> dict:
  """Distinct prompts and (prompt, answer) pairs among ``n`` samples, and their ratios to n."""
  key = jax.random.key(0) if key is None else key
  problems = env.sample(key, n, level=level, split=split)
  prompts = len({p.prompt for p in problems})
  pairs = len({(p.prompt, p.answer) for p in problems})
  return {
    "n": n,
    "distinct_prompts": prompts,
    "distinct_pairs": pairs,
    "prompt_ratio": prompts / n,
    "pair_ratio": pairs / n,
  }


def _ngrams(text: str, n: int) -> set[str]:
  padded = f"^{text}$"
  return {padded[i : i + n] for i in range(max(len(padded) - n + 1, 1))}


def edit_distance(a: str, b: str) -> int:
  """Levenshtein distance."""
  prev = list(range(len(b) + 1))
  for i, ca in enumerate(a, 1):
    cur = [i]
    for j, cb in enumerate(b, 1):
      cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
    prev = cur
  return prev[-1]


def near_duplicates(
  prompts: Mapping[str, Sequence[str]],
  *,
  threshold: float = 0.8,
  ngram: int = 3,
  max_examples: int = 3,
) -> dict[str, dict]:
  """Cross-environment prompt pairs with n-gram Jaccard similarity >= ``threshold``.

  Args:
    prompts: env name -> its prompts (deduplicated here).
  Returns:
    ``"envA|envB" -> {"exact", "near", "compared", "examples"}`` for every env pair with at
    least one hit: ``exact`` identical prompts, ``near`` non-identical pairs at or above the
    threshold, ``examples`` as (prompt A, prompt B, jaccard, normalised edit distance).
  """
  names, texts = [], []
  for name, items in prompts.items():
    for t in dict.fromkeys(items):
      names.append(name)
      texts.append(t)
  if not texts:
    return {}
  vocab: dict[str, int] = {}
  rows, cols = [], []
  for i, t in enumerate(texts):
    for g in _ngrams(t, ngram):
      rows.append(i)
      cols.append(vocab.setdefault(g, len(vocab)))
  x = sparse.csr_matrix(
    (np.ones(len(rows), np.float32), (rows, cols)), shape=(len(texts), len(vocab))
  )
  sizes = np.asarray(x.sum(axis=1)).ravel()
  inter = sparse.triu(x @ x.T, k=1).tocoo()
  jaccard = inter.data / (sizes[inter.row] + sizes[inter.col] - inter.data)
  env_index = np.asarray([list(prompts).index(n) for n in names])
  counts = {name: len(dict.fromkeys(items)) for name, items in prompts.items()}
  out: dict[str, dict] = {}
  for i, j, s in zip(inter.row, inter.col, jaccard):
    if s < threshold or env_index[i] == env_index[j]:
      continue
    a, b = sorted((names[i], names[j]))
    ta, tb = (texts[i], texts[j]) if names[i] == a else (texts[j], texts[i])
    entry = out.setdefault(
      f"{a}|{b}", {"exact": 0, "near": 0, "compared": counts[a] * counts[b], "examples": []}
    )
    entry["exact" if ta == tb else "near"] += 1
    if len(entry["examples"]) < max_examples:
      dist = edit_distance(ta, tb) / max(len(ta), len(tb), 1)
      entry["examples"].append((ta, tb, round(float(s), 3), round(dist, 3)))
  return out


def perturb(answer: str, chars: str) -> list[str]:
  """Two wrong variants of an answer: one character appended, and the last character replaced
  by the next character of ``chars`` (sorted, cyclic)."""
  pool = sorted(set(chars) - {" "}) or ["0"]
  last = answer[-1] if answer else pool[0]
  nxt = pool[(pool.index(last) + 1) % len(pool)] if last in pool else pool[0]
  return [answer + (answer[-1:] or pool[0]), answer[:-1] + nxt]


def verifier_consistency(env, level: int, *, n: int = 200, key=None, split: str = "train") -> dict:
  """``own`` = mean score of the generator's answers (should be 1), ``perturbed`` = mean score
  of perturbed answers (should be 0 for unique-answer tasks), ``malformed`` = mean score of junk
  completions (must be 0), ``raised`` = verifier exceptions (must be 0)."""
  key = jax.random.key(1) if key is None else key
  problems = env.sample(key, n, level=level, split=split)
  own, bad, junk, raised = [], [], [], 0
  for p in problems:
    try:
      own.append(env.verify(p, p.answer))
      bad.extend(env.verify(p, w) for w in perturb(p.answer, env.chars) if w != p.answer)
      junk.extend(env.verify(p, w) for w in ("", "\n", "=" * 70, "é", p.prompt))
    except Exception:  # pylint: disable=broad-except
      raised += 1
  return {
    "n": n,
    "own": float(np.mean(own)) if own else 0.0,
    "perturbed": float(np.mean(bad)) if bad else 0.0,
    "malformed": float(np.mean(junk)) if junk else 0.0,
    "raised": raised,
  }


def problem_sets(
  envs: Mapping,
  *,
  n: int = 64,
  key=None,
  split: str = "eval",
  levels: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, dict[int, list]]:
  """env name -> level -> ``n`` problems (a fixed evaluation grid for ``pass_rate_by_level``)."""
  key = jax.random.key(2) if key is None else key
  out = {}
  for e, (name, env) in enumerate(envs.items()):
    out[name] = {}
    for level in (levels or {}).get(name, env.levels):
      k = jax.random.fold_in(jax.random.fold_in(key, e), level)
      out[name][level] = env.sample(k, n, level=level, split=split)
  return out


def pass_rate_by_level(
  sets: Mapping[str, Mapping[int, Sequence[base.Problem]]], solve: Solve, envs: Mapping
) -> dict[str, dict[int, float]]:
  """Mean verifier score of ``solve``'s completions per env and level. ``solve`` gets a list of
  prompts and returns one completion each (one call per env and level)."""
  out = {}
  for name, by_level in sets.items():
    out[name] = {}
    for level, problems in by_level.items():
      completions = list(solve([p.prompt for p in problems]))
      if len(completions) != len(problems):
        raise ValueError(
          f"solve returned {len(completions)} completions for "
          f"{len(problems)} prompts ({name} level {level})"
        )
      scores = [envs[name].verify(p, c) for p, c in zip(problems, completions)]
      out[name][level] = float(np.mean(scores)) if scores else float("nan")
  return out


def falls_with_level(
  rates: Mapping[str, Mapping[int, float]], *, tol: float = 0.0
) -> dict[str, list[tuple[int, int]]]:
  """env name -> the adjacent level pairs (l, l') where the pass rate *rises* by more than
  ``tol`` (empty lists everywhere = non-increasing in level, as a difficulty knob should be)."""
  out = {}
  for name, by_level in rates.items():
    levels = sorted(by_level)
    out[name] = [(a, b) for a, b in zip(levels, levels[1:]) if by_level[b] > by_level[a] + tol]
  return out


def noisy_oracle(sets_or_problems, *, error_per_char: float = 0.03, seed: int = 0) -> Solve:
  """A reference solver that knows the answers of the given problems and errs, per prompt
  deterministically (by hash), with probability ``1 - (1 - e)^(len(prompt) + len(answer))``:
  longer (harder) instances fail more often. Unknown prompts get an empty completion."""
  if isinstance(sets_or_problems, Mapping):
    problems = [p for by_level in sets_or_problems.values() for ps in by_level.values() for p in ps]
  else:
    problems = list(sets_or_problems)
  answers = {p.prompt: p.answer for p in problems}

  def solve(prompts: list[str]) -> list[str]:
    out = []
    for prompt in prompts:
      answer = answers.get(prompt)
      if answer is None:
        out.append("")
        continue
      h = hashlib.sha1(f"{seed}:{prompt}".encode()).digest()
      u = int.from_bytes(h[:8], "little") / 2**64
      ok = u < (1.0 - error_per_char) ** (len(prompt) + len(answer))
      out.append(answer if ok else answer + "?")
    return out

  return solve


def run(
  envs: Mapping,
  *,
  seeds: Sequence[int] = range(5),
  n: int = 20,
  diversity_n: int = 500,
  dup_per_level: int = 40,
  consistency_n: int = 100,
  pass_n: int = 64,
  solve: Solve | None = None,
  threshold: float = 0.8,
  ngram: int = 3,
) -> dict:
  """All diagnostics over ``envs`` (name -> env, mixtures excluded by the caller). Without a
  ``solve`` the pass-rate section uses ``noisy_oracle`` (a stand-in until a model is given)."""
  result = {
    "envs": {},
    "settings": {
      "seeds": list(seeds),
      "n": n,
      "diversity_n": diversity_n,
      "dup_per_level": dup_per_level,
      "threshold": threshold,
      "ngram": ngram,
      "consistency_n": consistency_n,
      "pass_n": pass_n,
      "solver": "given" if solve else "noisy_oracle",
    },
  }
  prompts = {}
  for e, (name, env) in enumerate(envs.items()):
    entry = {
      "bucket": getattr(env, "bucket", "-"),
      "levels": list(env.levels),
      "reliability": generation_reliability(env, seeds=seeds, n=n),
      "diversity": {},
      "consistency": {},
    }
    prompts[name] = []
    for level in env.levels:
      key = jax.random.fold_in(jax.random.key(1000 + e), level)
      entry["diversity"][level] = instance_diversity(env, level, n=diversity_n, key=key)
      entry["consistency"][level] = verifier_consistency(env, level, n=consistency_n, key=key)
      prompts[name] += [
        p.prompt
        for p in env.sample(jax.random.fold_in(key, 7), dup_per_level, level=level, split="train")
      ]
    result["envs"][name] = entry
  result["near_duplicates"] = near_duplicates(prompts, threshold=threshold, ngram=ngram)
  sets = problem_sets(envs, n=pass_n)
  solve = solve or noisy_oracle(sets)
  rates = pass_rate_by_level(sets, solve, envs)
  result["pass_rate"] = rates
  result["pass_rate_distinct"] = {
    name: {lvl: len({p.prompt for p in ps}) for lvl, ps in by_level.items()}
    for name, by_level in sets.items()
  }
  result["pass_rate_rises"] = falls_with_level(rates, tol=0.1)
  return result


def _fmt(x: float) -> str:
  return f"{x:.3f}" if x == x else "nan"


def report_markdown(result: dict) -> str:
  """The ``run`` result as a markdown report."""
  s = result["settings"]
  lines = [
    "# Environment substrate diagnostics",
    "",
    f"Settings: {s}",
    "",
    "## Generation reliability and verifier self-consistency",
    "",
    "Reliability = valid instances / requested over all seeds, both splits; own = score of "
    "the generator's answer (must be 1); perturbed = score of perturbed answers (0 for "
    "unique-answer tasks); malformed = score of junk (must be 0).",
    "",
    "| env | bucket | levels | calls | failures | invalid | min reliability | own | "
    "perturbed | malformed | raised |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  problems = []
  for name, e in result["envs"].items():
    rel, con = e["reliability"].values(), e["consistency"].values()
    lines.append(
      f"| {name} | {e['bucket']} | {e['levels'][0]}..{e['levels'][-1]} | "
      f"{sum(r['calls'] for r in rel)} | {sum(r['call_failures'] for r in rel)} | "
      f"{sum(r['invalid'] for r in rel)} | {_fmt(min(r['reliability'] for r in rel))} | "
      f"{_fmt(min(c['own'] for c in con))} | {_fmt(max(c['perturbed'] for c in con))} | "
      f"{_fmt(max(c['malformed'] for c in con))} | {sum(c['raised'] for c in con)} |"
    )
    problems += [
      f"- {name} level {lvl}: {err}" for lvl, r in e["reliability"].items() for err in r["errors"]
    ]
  if problems:
    lines += ["", "Errors (first few per level):", ""] + problems[:40]
  lines += [
    "",
    "## Instance diversity (distinct prompts / samples, per level)",
    "",
    "| env | " + " | ".join(f"L{i}" for i in range(1, 10)) + " |",
    "|---|" + "---|" * 9,
  ]
  for name, e in result["envs"].items():
    cells = [
      _fmt(e["diversity"][l]["prompt_ratio"]) if l in e["diversity"] else "" for l in range(1, 10)
    ]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  dups = result["near_duplicates"]
  lines += [
    "",
    f"## Cross-environment near-duplicates ({s['ngram']}-gram Jaccard >= {s['threshold']})",
    "",
  ]
  if not dups:
    lines.append("None found.")
  else:
    lines += [
      "| env pair | exact | near | compared | examples (a, b, jaccard, edit dist) |",
      "|---|---|---|---|---|",
    ]
    for pair, d in sorted(dups.items(), key=lambda kv: -(kv[1]["exact"] + kv[1]["near"])):
      ex = "; ".join(f"`{a}` `{b}` {j} {dd}" for a, b, j, dd in d["examples"])
      lines.append(f"| {pair} | {d['exact']} | {d['near']} | {d['compared']} | {ex} |")
  lines += [
    "",
    f"## Pass rate by level (solver: {s['solver']}; should fall with level)",
    "",
    "Each cell scores `pass_n` eval-split draws; a small level's eval split holds few "
    "distinct prompts (last column: the fewest over levels), which limits precision.",
    "",
    "| env | "
    + " | ".join(f"L{i}" for i in range(1, 10))
    + " | rises > 0.1 | min distinct prompts |",
    "|---|" + "---|" * 11,
  ]
  for name, rates in result["pass_rate"].items():
    cells = [_fmt(rates[l]) if l in rates else "" for l in range(1, 10)]
    rises = result["pass_rate_rises"][name]
    distinct = min(result.get("pass_rate_distinct", {}).get(name, {0: "-"}).values())
    lines.append(f"| {name} | " + " | ".join(cells) + f" | {rises or '-'} | {distinct} |")
  return "\n".join(lines) + "\n"
