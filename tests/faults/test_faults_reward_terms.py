"""Issue 23, a user's reward terms in a run (config.reward.terms): an RL step scores with the
weighted sum, logs each term, and a term that raises, hangs, returns NaN or a string fails only
itself, is counted and named once, and the run goes on."""

import os
import textwrap

import faults_rewards_helpers as helpers
import pytest

from posttrain_jax import methods as methods_lib

ROWS = 16  # the smoke config's 4 prompts x 4 rollouts

USER = textwrap.dedent('''
    import math
    import time

    def bonus(problem, completion):
      return 1.0

    def raises(problem, completion):
      raise KeyError("boom")

    def hangs(problem, completion):
      time.sleep(100)

    def nan(problem, completion):
      return math.nan

    def text(problem, completion):
      return "1.0"
''')


def test_a_run_scores_with_user_terms_and_goes_on_past_each_bad_case(tmp_path, capsys):
  path = tmp_path / "my_rewards.py"
  path.write_text(USER)
  terms = {
    "bonus": {"fn": f"{path}:bonus", "weight": 0.5},
    **{name: {"fn": f"{path}:{name}"} for name in ("raises", "hangs", "nan", "text")},
  }
  config = helpers.smoke_config(steps=1, timeout=0.25, max_error_rate=1.0, workers=2, terms=terms)
  methods_lib.run(config, str(tmp_path / "run"))
  (record,) = [r for r in helpers.records(tmp_path / "run") if r["step"] > 0]
  assert record["reward/bonus"] == 1.0 and record["reward/bonus/errors"] == 0.0
  for name in ("raises", "hangs", "nan", "text"):
    assert record[f"reward/{name}"] == 0.0 and record[f"reward/{name}/errors"] == ROWS
  # The total is the env's verifier plus 0.5 x bonus; the four bad terms add nothing.
  assert record["reward/mean"] == pytest.approx(record["reward/correct"] + 0.5, abs=1e-6)
  assert (
    sum(record[f"reward/errors/{k}"] for k in ("raised", "timeout", "nonfinite", "non_numeric"))
    == ROWS
  )  # a row's first failure
  err = capsys.readouterr().err
  warned = [l for l in err.splitlines() if l.startswith("warning: reward term")]
  assert sorted(l.split("'")[1] for l in warned) == ["hangs", "nan", "raises", "text"]
  assert all(f"({path}:" in l and " on problem " in l for l in warned)


def test_a_gsm8k_style_jsonl_runs_with_math_verify_and_a_format_term(tmp_path):
  """config.env.dataset = a question/answer JSONL (GSM8K layout): the run reads the golds after
  '####', scores with the math rule and a format term in the workers, and no call fails."""
  import json

  path = tmp_path / "gsm8k.jsonl"
  with open(path, "w") as f:
    for a in range(2, 10):
      for b in (3, 7):
        f.write(
          json.dumps(
            {
              "question": f"Sam has {a} pens and buys {b}. How many?",
              "answer": f"{a}+{b}={a + b}\n#### {a + b}",
            }
          )
          + "\n"
        )
  config = helpers.smoke_config(
    steps=1, max_error_rate=0.0, workers=2, terms={"format": {"weight": 0.1}}
  )
  config.env.dataset = str(path)
  methods_lib.run(config, str(tmp_path / "run"))
  (record,) = [r for r in helpers.records(tmp_path / "run") if r["step"] > 0]
  assert all(
    record[f"reward/errors/{k}"] == 0 for k in ("raised", "timeout", "nonfinite", "non_numeric")
  )
  assert record["reward/format/errors"] == 0 and record["reward/correct/errors"] == 0
  assert record["reward/mean"] == pytest.approx(
    record["reward/correct"] + 0.1 * record["reward/format"], abs=1e-6
  )


HOSTILE = textwrap.dedent('''
    import os
    import signal
    import sys

    MARK = {mark!r}

    def bonus(problem, completion):
      return 1.0

    def exits(problem, completion):  # kills its own worker
      os._exit(3)

    def huge(problem, completion):  # finite in float64, inf in the batch's float32 rewards
      return 1e39

    def quits(problem, completion):
      sys.exit(0)

    def kills_fork_server(problem, completion):  # once: the worker's parent is the fork server
      if not os.path.exists(MARK):
        open(MARK, "w").close()
        os.kill(os.getppid(), signal.SIGKILL)
      return 0.25
''')


@pytest.mark.parametrize("workers", [2, 0])
def test_hostile_terms_fail_only_themselves_and_the_run_goes_on(tmp_path, capsys, workers):
  """Issue 37: a term that kills its worker, kills the pool's fork server, returns 1e39 or
  calls sys.exit fails only itself (the env's own `correct` keeps its value), is counted, and
  the run completes."""
  path = tmp_path / "hostile.py"
  path.write_text(HOSTILE.format(mark=str(tmp_path / "killed")))
  names = ["huge", "quits"] + (["exits", "kills_fork_server"] if workers else [])
  terms = {"bonus": {"fn": f"{path}:bonus", "weight": 0.5}}
  terms.update({name: {"fn": f"{path}:{name}"} for name in names})
  config = helpers.smoke_config(
    steps=1, timeout=5.0, max_error_rate=1.0, workers=workers, terms=terms
  )
  methods_lib.run(config, str(tmp_path / "run"))
  assert (tmp_path / "run" / "rl" / "done.json").exists()
  (record,) = [r for r in helpers.records(tmp_path / "run") if r["step"] > 0]
  assert record["reward/bonus"] == 1.0 and record["reward/bonus/errors"] == 0.0
  assert record["reward/correct/errors"] == 0.0
  for name in ("huge", "quits", "exits"):
    if name in names:
      assert record[f"reward/{name}"] == 0.0 and record[f"reward/{name}/errors"] == ROWS, name
  if workers:  # the rows whose worker died with the fork server lost that term only
    from posttrain_jax.rewards import calls

    assert calls._POOL.restarts >= 1  # pylint: disable=protected-access
    # the workers die with their fork server; their calls are redone once, so an innocent term
    # (bonus, correct) loses nothing and at most the rows in flight lose the killer term
    assert record["reward/kills_fork_server/errors"] <= workers
    assert record["reward/kills_fork_server"] >= 0.25 * (ROWS - workers) / ROWS - 1e-6
  extra = 0.25 * record.get("reward/kills_fork_server", 0.0) / 0.25 if workers else 0.0
  assert record["reward/mean"] == pytest.approx(record["reward/correct"] + 0.5 + extra, abs=1e-6)
  err = capsys.readouterr().err
  assert "beyond float32's range" in err and "SystemExit: 0" in err


STRAYS = textwrap.dedent('''
    import subprocess
    import time

    PIDS = {pids!r}

    def spawns_and_hangs(problem, completion):  # a checker whose child outlives the timeout
      child = subprocess.Popen(["sleep", "1000"])
      with open(PIDS, "a") as f:
        f.write(f"{{child.pid}} ")
      time.sleep(1000)
''')


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
  except OSError:
    return False


def test_what_a_timed_out_term_started_dies_with_it(tmp_path):
  """Issue 37: a term whose checker starts a process and then hangs past its timeout leaves
  nothing running: the worker kills its process group's strays after the call."""
  pids = tmp_path / "pids"
  path = tmp_path / "strays.py"
  path.write_text(STRAYS.format(pids=str(pids)))
  terms = {"spawns": {"fn": f"{path}:spawns_and_hangs"}}
  config = helpers.smoke_config(steps=1, timeout=0.3, max_error_rate=1.0, workers=2, terms=terms)
  methods_lib.run(config, str(tmp_path / "run"))
  started = [int(x) for x in pids.read_text().split()]
  assert len(started) >= ROWS
  assert not [p for p in started if _alive(p)]


KEEPER = textwrap.dedent('''
    import os
    import subprocess
    import sys

    sys.path.insert(0, {here!r})
    PIDS = {pids!r}

    def keeps_a_helper(problem, completion):  # a helper process kept across calls
      child = subprocess.Popen(["sleep", "1000"])
      with open(PIDS, "a") as f:
        f.write(f"{{os.getpid()}} {{child.pid}} ")
      return 1.0

    def get_config():
      import faults_rewards_helpers as helpers
      terms = {{"keeper": {{"fn": __file__ + ":keeps_a_helper"}}}}
      c = helpers.smoke_config(steps=200, max_error_rate=1.0, workers=2, terms=terms)
      return c
''')


def test_kill_9_of_the_run_takes_the_workers_and_what_they_started(tmp_path):
  """Issue 37: after kill -9 of the run, no reward worker and nothing a reward call started is
  alive a few seconds later (the fork server exits, each worker gets SIGTERM from the kernel
  and kills its process group)."""
  import signal
  import subprocess
  import sys
  import time

  pids = tmp_path / "pids"
  config = tmp_path / "keeper_config.py"
  here = os.path.dirname(os.path.abspath(__file__))
  config.write_text(KEEPER.format(here=here, pids=str(pids)))
  proc = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "posttrain_jax.main",
      f"--config={config}",
      f"--workdir={tmp_path / 'w'}",
    ],
    cwd=helpers.REPO,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  deadline = time.monotonic() + 300
  while time.monotonic() < deadline and len(pids.read_text().split() if pids.exists() else []) < 8:
    time.sleep(0.2)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  started = [int(x) for x in pids.read_text().split()]
  assert len(started) >= 8
  killed = time.monotonic()
  while time.monotonic() < killed + 10 and [p for p in started if _alive(p)]:
    time.sleep(0.05)
  assert not [p for p in started if _alive(p)]
  print(f"gone {time.monotonic() - killed:.2f} s after the kill")
  assert time.monotonic() - killed < 2.0  # the bar is a second; loaded CI machines
