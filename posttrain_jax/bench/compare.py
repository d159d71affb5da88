"""Ours against TRL and tunix on the same GRPO workloads, in one invocation: results/bench.md.

    make peers                                   # once: .venv-trl and .venv-tunix
    python scripts/bench_compare.py --runs 5     # tiny, tiny_kl, small; curves over T and G
    python scripts/bench_compare.py --workloads time_to_target   # results/time_to_target.md

Runs alternate (ours, TRL, tunix, ours, ...) so that drifting machine load hits every side
alike; each run is a fresh process. Per workload the table gives the median over runs of each
run's median steady-state iteration time, the min and max over runs, and the ratio peer / ours
(> 1: we are faster). The generation-only figure compares our sampler with HF ``generate``.
The curves time one run per point of the completion length T (16..512) and the group size G
(2..32) on the tiny shape. A peer whose virtual environment is missing is reported as such.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEERS = {
  "trl": (".venv-trl/bin/python", "scripts/peers/trl_grpo_bench.py"),
  "tunix": (".venv-tunix/bin/python", "scripts/peers/tunix_grpo_bench.py"),
}
GENERATE_PEER = (".venv-trl/bin/python", "scripts/peers/hf_generate_bench.py")
# glibc settings equal to what posttrain_jax applies in-process (parallel/host.py): peers run
# with them unless --peer_malloc=system, so the ratio does not credit us with the allocator.
TUNED_MALLOC_ENV = {
  "MALLOC_ARENA_MAX": "1",
  "MALLOC_MMAP_MAX_": "0",
  "MALLOC_TRIM_THRESHOLD_": str(1 << 62),
  "MALLOC_TOP_PAD_": str(256 << 20),
}
_PEER_ENV = {}


def _run(cmd: list[str], timeout: int) -> dict | None:
  """The JSON record a benchmark prints (ours: last line; peers: ``RESULT {...}``)."""
  env = dict(os.environ)
  if cmd[0] != sys.executable:  # a peer
    env.update(_PEER_ENV)
  try:
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
  except subprocess.TimeoutExpired:
    print(f"  timed out: {' '.join(cmd)}", flush=True)
    return None
  if proc.returncode:
    print(f"  failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-1500:]}", flush=True)
    return None
  for line in reversed(proc.stdout.strip().splitlines()):
    line = line.strip()
    if line.startswith("RESULT "):
      return json.loads(line[len("RESULT ") :])
    if line.startswith("{"):
      return json.loads(line)
  return None


def ours_cmd(workload: str, iters: int, extra=()) -> list[str]:
  return [
    sys.executable,
    "scripts/bench.py",
    "--workload",
    workload,
    "--iters",
    str(iters),
    "--json",
    *extra,
  ]


def peer_cmd(peer: str, workload: str, steps: int, extra=()) -> list[str]:
  python, script = PEERS[peer]
  return [python, script, "--workload", workload, "--steps", str(steps), "--repeats", "1", *extra]


def _seconds(record: dict | None, ours: bool) -> float | None:
  if record is None:
    return None
  return record["iteration_s"] if ours else record["median_s"]


def compare(workloads, runs: int, iters: int, peer_steps: dict, peers, timeout: int) -> dict:
  """{workload: {side: [per-run median seconds]}} plus the commands used."""
  out = {}
  for w in workloads:
    sides = {"ours": []} | {p: [] for p in peers}
    cmds = {"ours": " ".join(ours_cmd(w, iters)[1:])}
    for p in peers:
      cmds[p] = " ".join(peer_cmd(p, w, peer_steps.get(w, 6)))
    for r in range(runs):
      print(f"[{w}] run {r + 1}/{runs}", flush=True)
      rec = _run(ours_cmd(w, iters), timeout)
      sides["ours"].append(_seconds(rec, True))
      if rec is not None:
        sides.setdefault("ours_generate", []).append(rec["generate_s"])
        sides.setdefault("ours_sample", []).append(rec.get("sample_s"))
        sides.setdefault("ours_record", []).append(rec)
      for p in peers:
        sides[p].append(_seconds(_run(peer_cmd(p, w, peer_steps.get(w, 6)), timeout), False))
    out[w] = {"runs": sides, "commands": cmds}
  return out


def generation(runs: int, timeout: int) -> dict:
  """HF generate vs our sampler (64 x 16 forced tokens, tiny), per-run medians."""
  python, script = GENERATE_PEER
  hf = [
    _seconds(
      _run([python, script, "--workload", "tiny", "--steps", "11", "--repeats", "1"], timeout),
      False,
    )
    for _ in range(runs)
  ]
  return {"hf_generate": hf, "command": f"{python} {script} --workload tiny --steps 11"}


def curves(ts, gs, iters: int, peers, timeout: int) -> dict:
  """One run per (side, T) and (side, G) on the tiny shape."""
  out = {"T": {}, "G": {}, "work_gflop": {"T": [], "G": []}}
  for axis, values, flag in (("T", ts, "--max_new"), ("G", gs, "--group")):
    for v in values:
      print(f"[curve {axis}={v}]", flush=True)
      extra = (flag, str(v))
      record = _run(ours_cmd("tiny", iters, extra), timeout)
      out[axis].setdefault("ours", []).append((v, _seconds(record, True)))
      out["work_gflop"][axis].append((v, None if record is None else record.get("work_gflop")))
      for p in peers:
        out[axis].setdefault(p, []).append(
          (v, _seconds(_run(peer_cmd(p, "tiny", 4, extra), timeout), False))
        )
  return out


TTT_PEER = (".venv-trl/bin/python", "scripts/peers/trl_time_to_target.py")


def time_to_target(seeds, timeout: int, source: str | None = None) -> dict:
  """The time-to-target race per seed: ours with an empty compilation cache (cold), ours again
  with the cache that run filled (warm), then TRL from the same exported checkpoint."""
  import tempfile

  out = {"seeds": seeds, "ours_cold": [], "ours_warm": [], "trl": [], "commands": {}}
  extra = ["--ttt_source", source] if source else []
  prep = _run(ours_cmd("time_to_target", 1, ["--seeds", "", *extra]), timeout)
  if prep is None:
    return out
  python, script = TTT_PEER
  trl = [python, script, "--checkpoint", prep["checkpoint"], "--problems", prep["problems"]]
  for seed in seeds:
    print(f"[time_to_target] seed {seed}", flush=True)
    with tempfile.TemporaryDirectory(prefix="ttt_xla_") as cache:
      for side in ("ours_cold", "ours_warm"):
        rec = _run(
          ours_cmd("time_to_target", 1, ["--seeds", str(seed), "--cache_dir", cache, *extra]),
          timeout,
        )
        out[side].append(None if rec is None else rec["records"][0])
    if os.path.exists(os.path.join(REPO, python)):
      rec = _run([*trl, "--seeds", str(seed)], timeout)
      out["trl"].append(None if rec is None else rec["records"][0])
  out["commands"] = {
    "ours": " ".join(
      ours_cmd("time_to_target", 1, ["--seeds", "S", "--cache_dir", "DIR", *extra])[1:]
    ),
    "trl": " ".join([*trl, "--seeds", "S"]),
  }
  return out


def _ttt_cell(rec, threshold: str) -> str:
  if rec is None:
    return "failed"
  hit = rec["reached"].get(threshold)
  return "not reached" if hit is None else f"{hit['seconds']:.2f} ({hit['step']})"


def write_ttt_report(path: str, race: dict, command: str) -> str:
  """results/time_to_target.md: per seed and threshold, seconds (steps) to reach it."""
  sides = [s for s in ("ours_cold", "ours_warm", "trl") if race[s]]
  lines = [
    "# Time to target: GRPO from one pretrained checkpoint until held-out greedy accuracy "
    "reaches 60%",
    "",
    f"Made by `{command}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. "
    "Both start from the quickstart's pretrained tiny model (exported to Hugging Face "
    "format for TRL), with the same hyperparameters (16 prompts × 8 rollouts, 6 new "
    "tokens, AdamW lr 1e-4, no KL, token-mean clipped loss) and the same 500 held-out "
    "problems. Seconds of GRPO (evaluations excluded; our compilation included) and, in "
    "parentheses, RL steps until an evaluation (every 5 steps) first reached the "
    "threshold. ours_cold: an empty compilation cache; ours_warm: the cache the cold "
    "run filled (a rerun: JAX's compilation cache and the whole programs the cold run "
    "stored, parallel/executables.py).",
    "",
  ]
  thresholds = None
  for side in sides:
    for rec in race[side]:
      if rec is not None:
        thresholds = list(rec["reached"])
        break
    if thresholds:
      break
  thresholds = thresholds or ["0.6"]
  lines += [
    "| seed | side | start accuracy | "
    + " | ".join(f"to {t}" for t in thresholds)
    + " | s per step | first step s | setup s |",
    "|---" * (6 + len(thresholds)) + "|",
  ]
  for i, seed in enumerate(race["seeds"]):
    for side in sides:
      rec = race[side][i] if i < len(race[side]) else None
      if rec is None:
        lines.append(f"| {seed} | {side} | failed |" + " |" * (len(thresholds) + 3))
        continue
      lines.append(
        f"| {seed} | {side} | {rec['start_accuracy']:.3f} | "
        + " | ".join(_ttt_cell(rec, t) for t in thresholds)
        + f" | {rec['iteration_s']:.3f} | {rec['first_iteration_s']:.2f} | "
        f"{rec['setup_s']:.2f} |"
      )
  lines += [
    "",
    "Median over seeds of the seconds to each threshold (a seed that never reached "
    "it counts as infinitely slow); ratio = TRL / ours (> 1: ours is faster):",
    "",
    "| threshold | " + " | ".join(sides) + " | TRL / ours_cold | TRL / ours_warm |",
    "|---" * (len(sides) + 3) + "|",
  ]
  for t in thresholds:
    med = {}
    for side in sides:
      secs = sorted(
        float("inf") if r is None or r["reached"].get(t) is None else r["reached"][t]["seconds"]
        for r in race[side]
      )
      med[side] = statistics.median(secs) if secs else float("inf")
    ratio = lambda a: (
      "—"
      if "trl" not in med or med.get(a, float("inf")) in (0, float("inf"))
      else f"{med['trl'] / med[a]:.2f}"
    )
    lines.append(
      f"| {t} | "
      + " | ".join(f"{med[s]:.2f}" for s in sides)
      + f" | {ratio('ours_cold')} | {ratio('ours_warm')} |"
    )
  lines += ["", "Commands (S = seed; DIR = the compilation cache):", ""]
  lines += [f"- {side}: `{cmd}`" for side, cmd in race["commands"].items()]
  text = "\n".join(lines) + "\n"
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
  with open(os.path.splitext(path)[0] + ".json", "w", encoding="utf-8") as f:
    json.dump(race, f)
  return text


def _stats(xs):
  xs = [x for x in xs if x is not None]
  if not xs:
    return None
  return statistics.median(xs), min(xs), max(xs), len(xs)


def write_report(
  path: str, results: dict, gen: dict | None, curve: dict | None, command: str
) -> str:
  lines = [
    "# Speed: our GRPO iteration against TRL and tunix (this machine)",
    "",
    f"Made by `{command}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. "
    "Seconds per iteration: the median over runs of each run's median steady-state "
    "iteration (first steps excluded), then min and max over runs. Ratio = peer / ours "
    "(> 1: ours is faster). " + _malloc_note(),
    "",
    "| workload | side | runs | median s | min s | max s | ratio peer / ours |",
    "|---|---|---|---|---|---|---|",
  ]
  for w, res in results.items():
    ours = _stats(res["runs"]["ours"])
    for side, xs in res["runs"].items():
      if side in ("ours_generate", "ours_sample", "ours_record"):
        continue
      st = _stats(xs)
      if st is None:
        lines.append(f"| {w} | {side} | 0 | — | — | — | not run (missing venv or failed) |")
        continue
      ratio = "—" if side == "ours" or ours is None else f"{st[0] / ours[0]:.2f}"
      lines.append(
        f"| {w} | {side} | {st[3]} | {st[0]:.3f} | {st[1]:.3f} | {st[2]:.3f} | {ratio} |"
      )
  if gen is not None:
    hf = _stats(gen["hf_generate"])
    tiny_runs = results.get("tiny", {}).get("runs", {})
    ours_gen = _stats(tiny_runs.get("ours_generate", []))
    ours_sample = _stats([x for x in tiny_runs.get("ours_sample", []) if x is not None])
    if hf and ours_sample:
      lines += [
        "",
        f"Generation only (tiny, 64 × 16 forced tokens, prompts already encoded, "
        f"as HF generate is timed): our sampler {ours_sample[0]:.3f} s vs HF generate "
        f"{hf[0]:.3f} s: ratio {hf[0] / ours_sample[0]:.2f}.",
      ]
    if hf and ours_gen:
      lines += [
        "",
        f"Our generation stage with its host work (prompt encoding, weight copy, "
        f"decoding and scoring the texts): {ours_gen[0]:.3f} s, ratio "
        f"{hf[0] / ours_gen[0]:.2f} to HF generate alone.",
        "",
      ]
  for w, res in results.items():
    recs = res["runs"].get("ours_record", [])
    if recs:
      r = recs[len(recs) // 2]
      shared = r.get("shared_prefix_group", 0)
      mfu = f"MFU {r['mfu']:.0%} of {r['matmul_peak_gflops']:.0f} GFLOP/s" + (
        f" (executed FLOPs of the shared-prompt forward, group {shared}; "
        f"{r['mfu_full_forward']:.0%} counting the per-row forward's FLOPs)"
        if shared
        else ""
      )
      layout = (
        f"trainer on CPU device 0, sampler rows over {r['sampler_devices']} CPU devices"
        if r.get("sampler_devices")
        else "trainer and sampler on one device"
      )
      lines.append(
        f"- ours, {w} ({layout}): train step {r['train_step_s']:.3f} s, generate "
        f"{r['generate_s']:.3f} s (sampler alone {r.get('sample_s', float('nan')):.3f}"
        f" s), {mfu}, decode {r['decode_gflops']:.0f} GFLOP/s, "
        f"compile {r['compile_s']:.1f} s, steady-state compiles "
        f"{r['steady_compiles']}"
      )
  lines += ["", "Commands (one run each):", ""]
  for w, res in results.items():
    for side, cmd in res["commands"].items():
      lines.append(f"- {w}, {side}: `{cmd}`")
  if curve is not None:
    lines += [
      "",
      "Curves (tiny shape, one run per point, seconds per iteration): bench_T.png, bench_G.png.",
      "",
    ]
    for axis in ("T", "G"):
      sides = list(curve[axis])
      work = dict(curve.get("work_gflop", {}).get(axis, []))
      lines += [
        f"| {axis} | " + " | ".join(sides) + " | work (GFLOP) |",
        "|---" * (len(sides) + 2) + "|",
      ]
      values = [v for v, _ in curve[axis][sides[0]]]
      for i, v in enumerate(values):
        cells = [curve[axis][sd][i][1] for sd in sides] + [work.get(v)]
        lines.append(
          f"| {v} | " + " | ".join("—" if c is None else f"{c:.3f}" for c in cells) + " |"
        )
      lines += ["", _growth(axis, curve[axis], work, values), ""]
    _plot(curve, os.path.dirname(path) or ".")
  text = "\n".join(lines) + "\n"
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
  with open(os.path.splitext(path)[0] + ".json", "w", encoding="utf-8") as f:
    json.dump(
      {"results": {w: r["runs"] for w, r in results.items()}, "generation": gen, "curves": curve},
      f,
      default=str,
    )
  return text


def _growth(axis: str, points: dict, work: dict, values: list) -> str:
  """One line: how much the work and each side's time grow from the first to the last point
  (time growing faster than the work means the implementation loses efficiency)."""
  lo, hi = values[0], values[-1]
  scale = lambda a, b: "—" if a is None or b is None or not a else f"{b / a:.1f}x"
  times = ", ".join(
    f"{side} {scale(dict(pts).get(lo), dict(pts).get(hi))}" for side, pts in points.items()
  )
  return (
    f"From {axis} = {lo} to {hi} ({hi / lo:g}x): work (the update's and the generation's "
    f"FLOPs per row, attention included) {scale(work.get(lo), work.get(hi))}; time "
    f"{times}."
  )


def _malloc_note() -> str:
  if _PEER_ENV:
    return (
      "Our library tunes glibc malloc in-process (posttrain_jax/parallel/host.py); the "
      "peers ran with the same settings through the environment ("
      + " ".join(f"{k}={v}" for k, v in _PEER_ENV.items())
      + "). They help TRL too: one "
      "pair of tiny runs here gave 0.273 s per step as shipped and 0.240 s with them."
    )
  return (
    "Our library tunes glibc malloc in-process (posttrain_jax/parallel/host.py); the "
    "peers ran with glibc's defaults (--peer_malloc=system)."
  )


def _plot(curve: dict, out_dir: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  for axis, label in (("T", "completion length T"), ("G", "group size G")):
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for side, points in curve[axis].items():
      pts = [(v, s) for v, s in points if s is not None]
      if pts:
        ax.plot(*zip(*pts), marker="o", label=side)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(label)
    ax.set_ylabel("seconds per iteration")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, f"bench_{axis}.png"), dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workloads", default="tiny,tiny_kl,small")
  parser.add_argument("--runs", type=int, default=5)
  parser.add_argument("--iters", type=int, default=10, help="our timed iterations per run")
  parser.add_argument("--peers", default="trl,tunix")
  parser.add_argument("--curve_t", default="16,32,64,128,256,512")
  parser.add_argument("--curve_g", default="2,4,8,16,32")
  parser.add_argument("--no_curves", action="store_true")
  parser.add_argument("--timeout", type=int, default=1800)
  parser.add_argument("--out", default=os.path.join("results", "bench.md"))
  parser.add_argument("--seeds", default="0,1,2", help="time_to_target: RL seeds")
  parser.add_argument(
    "--ttt_source",
    default=None,
    help="time_to_target: a run workdir whose pretrain stage to export "
    "(default: pretrain the quickstart's checkpoint once, a few minutes)",
  )
  parser.add_argument("--ttt_out", default=os.path.join("results", "time_to_target.md"))
  parser.add_argument(
    "--peer_malloc",
    choices=("tuned", "system"),
    default="tuned",
    help="run the peers with our glibc malloc settings (tuned) or glibc's defaults",
  )
  args = parser.parse_args(argv)
  if args.peer_malloc == "tuned":
    _PEER_ENV.update(TUNED_MALLOC_ENV)
  peers = [p for p in args.peers.split(",") if p]
  bad = [p for p in peers if p not in PEERS]
  if bad:
    print(f"error: unknown peer(s) {bad}; valid: {', '.join(PEERS)}", file=sys.stderr)
    return 2
  missing = [p for p in peers if not os.path.exists(os.path.join(REPO, PEERS[p][0]))]
  if missing:
    print(f"note: no virtual environment for {missing}; run `make peers` first", flush=True)
    peers = [p for p in peers if p not in missing]
  workloads = [w for w in args.workloads.split(",") if w]
  command = "python scripts/bench_compare.py " + " ".join(sys.argv[1:])
  if "time_to_target" in workloads:
    workloads.remove("time_to_target")
    race = time_to_target([int(s) for s in args.seeds.split(",")], args.timeout, args.ttt_source)
    print(write_ttt_report(args.ttt_out, race, command.strip()))
    if not workloads:
      return 0
  peer_steps = {"tiny": 12, "tiny_kl": 12, "small": 3}
  results = compare(workloads, args.runs, args.iters, peer_steps, peers, args.timeout)
  gen = None
  if os.path.exists(os.path.join(REPO, GENERATE_PEER[0])) and "tiny" in workloads:
    gen = generation(args.runs, args.timeout)
  curve = (
    None
    if args.no_curves
    else curves(
      [int(t) for t in args.curve_t.split(",")],
      [int(g) for g in args.curve_g.split(",")],
      max(3, args.iters // 2),
      peers,
      args.timeout,
    )
  )
  print(write_report(args.out, results, gen, curve, command.strip()))
  return 0
