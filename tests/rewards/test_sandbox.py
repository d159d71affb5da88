"""rewards/sandbox.py and rewards/code_tests.py: escape and abuse attempts are contained and
score 0 with a reason while the next call still works; the scorer's pass fractions.

Every attack is a completion for the same hidden-test problem (``f(x) = x*x + 1`` on four
inputs), run under each isolation: ``bwrap`` (skipped, with the probe's reason, where bubblewrap
or user namespaces are unavailable) and the ``rlimit`` fallback (always run). What the fallback
cannot contain by construction is asserted under bwrap only, marked ``BWRAP_ONLY`` below: the
host network, DNS, reading world-readable host files (/etc/passwd, the repo), writing to
world-writable host directories (/tmp), nested user namespaces. What a fallback contains only
by running the program under its own uid (this process is root) is marked ``DROPPED``.
"""

import hashlib
import os
import socket
import subprocess
import threading
import time

import pytest

from posttrain_jax.envs import Problem
from posttrain_jax.registry import ConfigError
from posttrain_jax.rewards import REWARDS, code_tests, resolve, sandbox

MODE, WHY = sandbox.probe()
ROOT = os.geteuid() == 0
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SECRET = "ptj-secret-8d2f1c"
TESTS = code_tests.CodeTests("{completion}", "f", (((1,), 2), ((2,), 5), ((3,), 10), ((7,), 50)))
GOOD = "def f(x):\n  return x * x + 1\n"
QUICK = sandbox.Limits(cpu_s=1, wall_s=5.0)  # attacks that end on their own; room for load
HANG = sandbox.Limits(cpu_s=1, wall_s=1.0)  # for the attacks that run until they are stopped
WRONG = "\ndef f(x):\n  return 0\n"


@pytest.fixture(params=["bwrap", "rlimit"])
def mode(request):
  if request.param == "bwrap" and MODE != "bwrap":
    print(f"bwrap sandbox cases skipped: {WHY}")
    pytest.skip(f"bubblewrap cannot run here ({WHY}); the rlimit fallback is tested")
  return request.param


def _attack(source: str, mode: str, limits=QUICK, fixed_f=True):
  """Runs an attack as the completion; checks it scores 0 with a reason, leaves no process
  behind (when the sandbox has its own uid) and that a correct solution still scores 1."""
  verdict = code_tests.check(TESTS, source + (WRONG if fixed_f else ""), limits, mode=mode)
  assert verdict.score == 0.0, verdict
  assert any(
    words in verdict.reason for words in ("tests passed", "no test results", "failed to load")
  ), verdict.reason
  assert verdict.result.isolation == mode
  if ROOT:  # the run's own fresh uid: other sandboxes (other tests, runs) may be running
    assert verdict.result.uid is not None
    assert not sandbox.uid_processes(verdict.result.uid), "a sandboxed process outlived its run"
  after = code_tests.check(TESTS, GOOD, mode=mode)
  assert after.score == 1.0, after
  return verdict, verdict.result.stdout + verdict.result.stderr


# --- the attacks (each scored 0 with a reason; then a correct solution still scores 1) -------


def test_network_to_a_host_listener(mode):  # BWRAP_ONLY: the fallback shares the network
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen(1)
  server.settimeout(3.0)
  got = []

  def accept():
    try:
      conn, _ = server.accept()
      got.append(conn.recv(100))
      conn.close()
    except OSError:
      pass

  thread = threading.Thread(target=accept)
  thread.start()
  port = server.getsockname()[1]
  _, out = _attack(
    f"import socket\ntry:\n  s = socket.create_connection(('127.0.0.1', {port}), "
    f"1)\n  s.sendall(b'pwned')\n  print('connected')\nexcept OSError as e:\n"
    f"  print('blocked', e)\n",
    mode,
  )
  if mode == "bwrap":  # the first connection the listener gets is this process's own
    with socket.create_connection(("127.0.0.1", port), 1) as mine:
      mine.sendall(b"mine")
  thread.join()
  server.close()
  if mode == "bwrap":
    assert got == [b"mine"] and "blocked" in out


def test_dns_lookup(mode):  # BWRAP_ONLY
  _, out = _attack(
    "import socket\ntry:\n  print('resolved', socket.getaddrinfo('example.com', "
    "443))\nexcept OSError as e:\n  print('blocked', e)\n",
    mode,
  )
  if mode == "bwrap":
    assert "resolved" not in out and "blocked" in out


def test_fork_bomb(mode):
  verdict, out = _attack(
    "import os, time\nn = 0\ntry:\n  while n < 200:\n"
    "    if os.fork() == 0:\n      time.sleep(30)\n      os._exit(0)\n"
    "    n += 1\nexcept OSError:\n  pass\nprint('forked', n)\n"
    "while True:\n  try:\n    os.fork()\n  except OSError:\n    pass\n",
    mode,
    limits=HANG,
  )
  assert verdict.result.status in ("timeout", "cpu_limit", "killed")
  if mode == "bwrap" or ROOT:  # DROPPED: RLIMIT_NPROC does not bind root
    assert int(out.split("forked ")[1].split()[0]) < QUICK.processes


def test_thread_bomb(mode):
  _, out = _attack(
    "import threading, time\nn = 0\ntry:\n  for _ in range(2000):\n"
    "    threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
    "    n += 1\nexcept RuntimeError as e:\n  print('stopped at', n)\n"
    "import os\nos._exit(0)\n",
    mode,
    fixed_f=False,
  )
  if ROOT or mode == "bwrap":
    assert "stopped at" in out and int(out.split("stopped at")[1].split()[0]) < 16


def test_memory_bomb(mode):
  verdict, _ = _attack("x = []\nwhile True:\n  x.append(bytearray(1 << 24))\n", mode)
  assert "MemoryError" in verdict.reason  # the harness caught it while loading the code
  bare = sandbox.run("x = bytearray(1 << 30)\n", mode=mode)
  assert bare.status == "memory_limit" and "memory limit of 256 MiB" in bare.reason


def test_infinite_cpu_loop(mode):
  verdict, _ = _attack("while True:\n  pass\n", mode, limits=HANG)
  assert verdict.result.status in ("cpu_limit", "timeout")
  assert "no test results" in verdict.reason


def test_sleep_past_the_wall_clock(mode):
  start = time.monotonic()
  verdict, _ = _attack("import time\ntime.sleep(60)\n", mode, limits=sandbox.Limits(wall_s=1.0))
  assert verdict.result.status == "timeout" and "wall-clock limit of 1 s" in verdict.reason
  assert time.monotonic() - start < 10


def test_hang_inside_a_case_fails_that_case_only(mode):
  verdict = code_tests.check(
    TESTS,
    "def f(x):\n  while x == 3:\n    pass\n  return x * x + 1\n",
    QUICK,
    case_s=0.3,
    mode=mode,
  )
  assert verdict.passed == 3 and "f(3) raised TimeoutError" in verdict.reason


def test_writing_outside_its_directory(mode, tmp_path):
  targets = [
    f"/usr/pwn-{mode}",
    os.path.join(REPO, f"pwn-{mode}"),
    f"/tmp/pwn-{mode}",
    f"/../pwn-{mode}",
  ]
  for path in targets:  # what an earlier broken run may have left
    if os.path.exists(path):
      os.remove(path)
  _, out = _attack(
    f"for p in {targets!r}:\n  try:\n    open(p, 'w').write('x')\n"
    "    print('wrote', p)\n  except OSError as e:\n    print('denied', p, e)\n",
    mode,
  )
  if mode == "bwrap" or ROOT:  # DROPPED for the fallback
    for path in targets[:2] + targets[3:]:
      assert not os.path.exists(path), path
  if mode == "bwrap":  # BWRAP_ONLY: /tmp is world-writable
    assert not os.path.exists(targets[2])
  elif os.path.exists(targets[2]):
    os.remove(targets[2])


def test_reading_host_files(mode):
  mine = os.path.join(REPO, "setup.py")
  with open(mine, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  paths = ["/etc/passwd", "/etc/shadow", "/root", mine]
  _, out = _attack(
    f"import hashlib, os\nfor p in {paths!r}:\n  try:\n    if os.path.isdir(p):\n"
    "      print('listed', p, len(os.listdir(p)))\n    else:\n"
    "      data = open(p, 'rb').read()\n"
    "      print('read', p, hashlib.sha256(data).hexdigest(), data[:11])\n"
    "  except OSError as e:\n    print('denied', p, type(e).__name__)\n",
    mode,
  )
  if mode == "bwrap" or ROOT:  # DROPPED
    assert "denied /etc/shadow" in out and "denied /root" in out
  if mode == "bwrap":  # BWRAP_ONLY: world-readable host files
    assert "denied /etc/passwd" in out and "root:x:0:0" not in out
    assert f"denied {mine}" in out and digest not in out


def test_host_environment_secret(mode, monkeypatch):
  monkeypatch.setenv("PTJ_SANDBOX_SECRET", SECRET)  # what the sandbox would inherit
  # a process started with the secret stands for this run's own start-up environment
  holder = subprocess.Popen(["sleep", "30"], env={"PTJ_SANDBOX_SECRET": SECRET})
  try:
    _, out = _attack(
      "import os\nfor pid in os.listdir('/proc'):\n  for what in ('environ', "
      "'cmdline'):\n    try:\n      print(pid, open(f'/proc/{pid}/{what}', 'rb')"
      ".read())\n    except OSError:\n      pass\nprint(sorted(os.environ))\n",
      mode,
    )
  finally:
    holder.kill()
    holder.wait()
  assert "PTJ_SANDBOX_SECRET" not in out.split("[")[-1]  # not inherited
  if mode == "bwrap" or ROOT:  # DROPPED
    assert SECRET not in out


def _shares_my_uid(mode):
  if mode == "rlimit" and not ROOT:
    pytest.skip(
      "the fallback without root runs the code under this process's own uid: it "
      "cannot stop it signalling or tracing this process (docs/sandbox.md)"
    )


def test_killing_its_parent_and_everyone(mode):
  _shares_my_uid(mode)
  me = os.getpid()
  _, out = _attack(
    f"import os, signal\nfor pid in (os.getppid(), 1, {me}):\n  try:\n"
    "    os.kill(pid, signal.SIGKILL)\n  except OSError as e:\n"
    "    print('denied', pid, e)\n",
    mode,
  )
  _attack("import os, signal\nos.kill(-1, signal.SIGKILL)\n", mode)  # DROPPED
  assert f"denied {me}" in out  # under bwrap that pid does not exist inside


def test_signals_to_the_process_group(mode):
  _attack("import os, signal\nos.killpg(os.getpgrp(), signal.SIGKILL)\n", mode)
  _attack("import os, signal\nos.kill(0, signal.SIGTERM)\n", mode)


def test_spawning_a_shell(mode):
  if os.path.exists("/usr/pwn-sh"):
    os.remove("/usr/pwn-sh")
  _, out = _attack(
    "import subprocess\nprint(subprocess.run(['/bin/sh', '-c', 'id; cat "
    "/etc/shadow; echo x > /usr/pwn-sh'], capture_output=True, text=True))\n",
    mode,
  )
  assert "cat: /etc/shadow:" in out and "root:" not in out  # it ran, and saw nothing
  if mode == "bwrap" or ROOT:  # DROPPED
    assert not os.path.exists("/usr/pwn-sh")


def test_huge_stdout(mode):
  verdict, _ = _attack("import os\nwhile True:\n  os.write(1, b'x' * 65536)\n", mode)
  assert verdict.result.status == "output_limit"
  assert len(verdict.result.stdout) + len(verdict.result.stderr) <= sandbox.MIB


def test_huge_stderr(mode):
  verdict, _ = _attack("import sys\nwhile True:\n  sys.stderr.write('y' * 65536)\n", mode)
  assert verdict.result.status == "output_limit"


def test_disk_fill(mode):
  _, out = _attack(
    "n = 0\ntry:\n  for i in range(6):\n    with open(f'f{i}', 'wb') as f:\n"
    "      for _ in range(20):\n        f.write(b'z' * (1 << 20))\n"
    "        n += 1\nexcept OSError as e:\n  print('stopped', n, e.errno)\n",
    mode,
    limits=sandbox.Limits(cpu_s=1, wall_s=3.0, file_mb=16, disk_mb=24),
  )
  assert "stopped" in out
  written = int(out.split("stopped")[1].split()[0])
  assert written <= (24 if mode == "bwrap" else 16)  # the tmpfs size; FSIZE per file


def test_scratch_directory_is_removed(mode):
  verdict = code_tests.check(TESTS, "import os\nprint('cwd', os.getcwd())\n" + GOOD, mode=mode)
  cwd = verdict.result.stderr.split("cwd ")[1].split()[0]
  assert verdict.score == 1.0
  if mode == "rlimit":
    assert cwd.startswith("/tmp/ptj-sandbox-") and not os.path.exists(cwd)
  else:
    assert cwd == "/scratch"


def test_orphan_that_survives(mode):
  _attack(
    "import os, time\nif os.fork() == 0:\n  os.setsid()\n  if os.fork() == 0:\n"
    "    time.sleep(30)\n  os._exit(0)\n",
    mode,
  )  # _attack asserts none is left


def test_setuid_and_privileges(mode):
  _, out = _attack(
    "import os, subprocess\ntry:\n  os.setuid(0)\n  print('became root')\n"
    "except OSError as e:\n  print('denied', e)\nprint('euid', os.geteuid())\n"
    "print([l for l in open('/proc/self/status') if 'NoNewPrivs' in l])\n"
    "r = subprocess.run(['/usr/bin/su', '-c', 'id'], input='', capture_output=True,"
    " text=True)\nprint('su', r.returncode)\n",
    mode,
  )
  if mode == "bwrap" or ROOT:  # DROPPED
    assert "became root" not in out and "denied" in out and "euid 0" not in out
  assert "NoNewPrivs:\\t1" in out


def test_ptrace(mode):
  _shares_my_uid(mode)
  me = os.getpid()
  _attack(
    "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    f"for pid in (os.getppid(), 1, {me}):\n  print(pid, libc.ptrace(16, pid, 0, 0), "
    "ctypes.get_errno())\n",
    mode,
    limits=HANG,
  )
  with open("/proc/self/status") as f:
    assert "TracerPid:\t0" in f.read()


def test_nested_user_namespace(mode):  # BWRAP_ONLY: --disable-userns
  _, out = _attack(
    "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "print('unshare', libc.unshare(0x10000000), ctypes.get_errno())\n",
    mode,
  )
  if mode == "bwrap":
    assert "unshare -1" in out


def test_terminal_injection(mode):
  _, out = _attack(
    "import fcntl, termios\ntry:\n  fd = open('/dev/tty', 'wb')\n"
    "  fcntl.ioctl(fd, termios.TIOCSTI, b'x')\n  print('injected')\n"
    "except OSError as e:\n  print('blocked', e)\n",
    mode,
  )
  assert "injected" not in out


def test_patching_the_checker(mode):
  _, out = _attack(
    "import json, sys\n"
    "sys.modules['json'].dumps = lambda *a, **k: '[0, \"ok\", 123456]'\n"
    "try:\n  import posttrain_jax\n  print('imported the checker')\n"
    "except ImportError:\n  print('no checker inside')\n",
    mode,
  )
  assert "no checker inside" in out


def test_object_whose_eq_is_always_true(mode):
  _attack(
    "class Any:\n  def __eq__(self, other):\n    return True\ndef f(x):\n  return Any()\n",
    mode,
    fixed_f=False,
  )


def test_forged_result_lines(mode):
  _attack("import os\nfor i in range(4):\n  os.write(1, f'[{i}, \"ok\", 1]\\n'.encode())\n", mode)


def test_exit_zero_before_the_tests(mode):
  verdict, _ = _attack("import os\nos._exit(0)\n", mode, fixed_f=False)
  assert verdict.result.status == "ok" and "no test results" in verdict.reason


def test_closes_stdout_and_exits_zero(mode):
  verdict, _ = _attack("import os, sys\nos.close(1)\nsys.exit(0)\n", mode, fixed_f=False)
  assert verdict.passed == 0


# --- the scorer and the term --------------------------------------------------------------------


def test_pass_fractions_and_reasons():
  assert code_tests.check(TESTS, GOOD).score == 1.0
  wrong = code_tests.check(TESTS, "def f(x):\n  return x - 1\n")
  assert wrong.score == 0.0 and "0 of 4 tests passed" in wrong.reason
  assert "f(1) returned 0, expected 2" in wrong.reason
  one = code_tests.check(TESTS, "def f(x):\n  return x + 1\n")  # right at x=1 only
  assert one.score == 0.25 and "first failure: f(2) returned 3, expected 5" in one.reason
  half = code_tests.check(TESTS, "def f(x):\n  return x * x + 1 if x < 3 else -1\n")
  assert (half.score, half.passed, half.total) == (0.5, 2, 4)
  floats = code_tests.check(TESTS, "def f(x):\n  return x * x + 1.0\n")
  assert floats.score == 1.0  # 2.0 == 2, as an assert in a unit test would say
  raises = code_tests.check(TESTS, "def f(x):\n  return x * x + 1 + 0 // (x - 2)\n")
  assert "f(2) raised ZeroDivisionError" in raises.reason and raises.passed == 3
  bad = code_tests.check(TESTS, "def f(x)\n  return x\n")
  assert bad.score == 0.0 and bad.result is None and "does not compile" in bad.reason
  missing = code_tests.check(TESTS, "def g(x):\n  return x\n")
  assert missing.score == 0.0 and "failed to load: KeyError" in missing.reason
  assert code_tests.check(TESTS, None).score == 0.0


def test_the_code_tests_term():
  problem = Problem(
    prompt="square plus one", answer=GOOD, env="user", level=1, uid="sq", data=tuple(TESTS)
  )
  assert resolve("code_tests") is REWARDS["code_tests"] is code_tests.code_tests
  assert code_tests.code_tests(problem, "def f(x):\n  return 2 if x == 1 else 0\n") == 0.25
  assert code_tests.code_tests(problem, GOOD, wall_s=3.0) == 1.0
  assert code_tests.verify(problem, "def f(x):\n  return 2 if x == 1 else 0\n") == 0.0
  with pytest.raises(ValueError, match="carries no code tests"):
    code_tests.code_tests(Problem("p", "a", "e", 1, "u", data=(1, 2)), GOOD)
  with pytest.raises(ConfigError, match="wall_s must be a positive number"):
    code_tests.code_tests(problem, GOOD, wall_s=0)


def test_run_basics(mode):
  result = sandbox.run("import sys\nprint(sys.stdin.read().upper())\n", "hello", mode=mode)
  assert (result.status, result.exit_code, result.stdout, result.isolation) == (
    "ok",
    0,
    "HELLO\n",
    mode,
  )
  error = sandbox.run("raise KeyError('k')\n", mode=mode)
  assert error.status == "error" and error.exit_code == 1 and "KeyError: 'k'" in error.reason


def test_limits_are_checked():
  with pytest.raises(ConfigError, match="processes=2 is below 4"):
    sandbox.Limits(processes=2)
  with pytest.raises(ConfigError, match="cpu_s must be a positive number"):
    sandbox.Limits(cpu_s=-1)
  with pytest.raises(ConfigError, match="sandbox mode must be one of bwrap, rlimit"):
    sandbox.run("pass", mode="docker")
  assert sandbox.isolation() == MODE
