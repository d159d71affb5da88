"""The environment a table's runs were made in: ``results/NAME/environment.jsonl``.

``scripts/reproduce.py`` appends one record per invocation that ran at least one job: the
commit and whether the checkout had uncommitted changes, the installed versions of the locked
dependencies beside the lock's (requirements.lock), Python, the CPU (model, cores, the
instruction-set flags XLA:CPU's code depends on), the XLA flags the runs saw, the worker layout
(backend, parallel jobs, XLA:CPU threads per run), when it started and finished, and how many
jobs ran or were already done. A table made before these records carries one line with
``recorded: false`` and what git knows of it (:func:`legacy_record`). Nothing here changes a
number; it says where a number came from (docs/reproducibility.md).
"""

import datetime
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys

from posttrain_jax.parallel import host

FILE = "environment.jsonl"
LOCK = "requirements.lock"
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# The CPU flags XLA:CPU's generated code and YNNPACK's kernels choose between.
ISA_FLAGS = (
  "sse4_2",
  "avx",
  "avx2",
  "fma",
  "f16c",
  "avx512f",
  "avx512bw",
  "avx512vl",
  "avx512_vnni",
  "avx512_bf16",
  "amx_tile",
  "asimd",
  "sve",
)


def _git(*args: str, root: str = ROOT) -> str | None:
  try:
    out = subprocess.run(
      ["git", *args], cwd=root, capture_output=True, text=True, timeout=20, check=False
    )
  except OSError:
    return None
  return out.stdout.strip() if out.returncode == 0 else None


def git_state(root: str = ROOT) -> dict:
  """``commit`` (full hash, 'unknown' outside a checkout) and ``dirty`` (uncommitted changes
  to tracked files outside ``results/``: untracked files such as run folders, and the tables a
  sweep or a rerun check has just rewritten, do not count; the code, configs and lock do)."""
  commit = _git("rev-parse", "HEAD", root=root)
  status = _git(
    "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results", root=root
  )
  return {"commit": commit or "unknown", "dirty": bool(status) if status is not None else None}


def cpu_info(cpuinfo: str = "/proc/cpuinfo") -> dict:
  """The CPU's model, the cores it has and this process may use, and which of
  :data:`ISA_FLAGS` it reports."""
  model, flags = platform.processor() or platform.machine(), set()
  try:
    with open(cpuinfo, encoding="utf-8") as f:
      text = f.read()
  except OSError:
    text = ""
  for key in ("model name", "Model", "cpu model"):
    m = re.search(rf"^{key}\s*:\s*(.+)$", text, re.M)
    if m:
      model = m.group(1).strip()
      break
  m = re.search(r"^(flags|Features)\s*:\s*(.+)$", text, re.M)
  if m:
    flags = set(m.group(2).split())
  usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return {
    "model": model,
    "machine": platform.machine(),
    "cores": os.cpu_count(),
    "usable_cores": usable,
    "isa": [f for f in ISA_FLAGS if f in flags],
  }


def read_lock(path: str) -> dict:
  """``{name: version}`` of a lock file's ``name==version`` lines (names normalised as pip
  does: lower case, runs of ``-_.`` as ``-``)."""
  out = {}
  with open(path, encoding="utf-8") as f:
    for line in f:
      m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", line)
      if m:
        out[normalise(m.group(1))] = m.group(2)
  return out


def normalise(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def installed(names) -> dict:
  """``{name: installed version or None}``."""
  out = {}
  for name in names:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  return out


def lock_state(lock_path: str | None = None) -> dict:
  """The lock file, whether every locked package that is installed has the locked version, and
  those that differ (``{name: [locked, installed]}``; packages the lock holds only for other
  platforms are absent here and not counted)."""
  lock_path = lock_path or os.path.join(ROOT, LOCK)
  if not os.path.exists(lock_path):
    return {"file": os.path.basename(lock_path), "found": False}
  locked = read_lock(lock_path)
  have = installed(locked)
  differs = {n: [v, have[n]] for n, v in sorted(locked.items()) if have[n] not in (None, v)}
  return {
    "file": os.path.basename(lock_path),
    "found": True,
    "matches": not differs,
    "differs": differs,
    "missing": sorted(n for n, v in have.items() if v is None),
  }


KEY_PACKAGES = ("jax", "jaxlib", "numpy", "flax", "optax", "orbax-checkpoint", "transformers")


def record(
  *,
  backend: str,
  workers: int,
  cpu_threads: int,
  started: str,
  jobs_run: int,
  jobs_cached: int,
  command: str = "",
) -> dict:
  """This machine's environment record for an invocation of a sweep (module docstring).
  ``cpu_threads``: the runs' ``config.cpu_threads``."""
  usable = cpu_info()["usable_cores"]
  flags = os.environ.get("XLA_FLAGS", "")
  if os.environ.get(host.XLA_ENV, "").lower() != "system":  # as the runs' processes set them
    flags = host.xla_flags(flags, host.cpu_only_process())
  return {
    "recorded": True,
    **git_state(),
    "command": command,
    "started": started,
    "finished": now(),
    "jobs_run": jobs_run,
    "jobs_cached": jobs_cached,
    "python": sys.version.split()[0],
    "platform": platform.platform(),
    "cpu": cpu_info(),
    "xla_flags": flags,
    "layout": {
      "backend": backend,
      "workers": workers,
      "cpu_threads": cpu_threads,
      # the pool XLA:CPU gets: cpu_threads, at most the cores (0: one per core)
      "pool_threads": min(cpu_threads, usable) if cpu_threads else usable,
    },
    "versions": installed(KEY_PACKAGES),
    "lock": lock_state(),
  }


def now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def legacy_record(out_dir: str) -> dict:
  """The record of a table made before environment records: what git knows (the commit that
  last wrote its runs.jsonl, and when); the machine, versions and flags are unknown."""
  log = _git("log", "-1", "--format=%H %cI", "--", os.path.join(out_dir, "runs.jsonl"))
  commit, _, date = (log or "").partition(" ")
  return {
    "recorded": False,
    "commit": commit or "unknown",
    "date": date or "unknown",
    "note": "made before environment records: the commit is the one that committed runs.jsonl; "
    "the machine, the versions and the XLA flags were not recorded",
  }


def append(out_dir: str, rec: dict) -> None:
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, FILE), "a", encoding="utf-8") as f:
    f.write(json.dumps(rec, sort_keys=True) + "\n")


def ensure(out_dir: str) -> None:
  """Gives a table folder without an environment record its :func:`legacy_record`."""
  if not os.path.exists(os.path.join(out_dir, FILE)):
    append(out_dir, legacy_record(out_dir))


def describe(rec: dict) -> str:
  """One line: the commit, the CPU, the key versions, the layout (or what is unknown)."""
  if not rec.get("recorded", False):
    return f"not recorded (commit {rec.get('commit', 'unknown')[:10]}, {rec.get('date', '?')})"
  cpu, lay = rec["cpu"], rec["layout"]
  versions = ", ".join(
    f"{k} {v}" for k, v in rec["versions"].items() if v and k in ("jax", "numpy")
  )
  lock = rec["lock"]
  lock_text = (
    "lock matches"
    if lock.get("matches")
    else f"{len(lock.get('differs', {}))} packages differ from the lock"
    if lock.get("found")
    else "no lock"
  )
  return (
    f"commit {rec['commit'][:10]}{' (dirty)' if rec['dirty'] else ''}, {cpu['model']} "
    f"({cpu['usable_cores']} cores; {'/'.join(cpu['isa'][-3:]) or 'no ISA flags'}), Python "
    f"{rec['python']}, {versions}, {lock_text}; {lay['backend']} backend, {lay['workers']} "
    f"workers, {lay.get('pool_threads', lay['cpu_threads'])} XLA:CPU thread(s) per run"
  )
