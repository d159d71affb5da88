"""Faults of the workdir (issue 21, items 2 and 3): two runs into one workdir, a lock left by a
killed run, a rerun with a changed config, --rerun, stage subsets and older config.json files.
Each test asserts the exact outcome and that nothing was lost."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys

import faults_workdir_helpers as h
import pytest

from posttrain_jax import methods as methods_lib
from posttrain_jax import parallel
from posttrain_jax.methods import validate
from posttrain_jax.train import ConfigError
from posttrain_jax.train import workdir as workdir_lib

HOLDER = (
  "import sys, time\n"
  "from posttrain_jax.train import workdir\n"
  "with workdir.lock(sys.argv[1]):\n"
  "  print('held', flush=True)\n"
  "  time.sleep(600)\n"
)


def _in_use(workdir, pid) -> str:
  """The refusal's pattern for a workdir locked by ``pid`` on this host."""
  return (
    rf"workdir {re.escape(str(workdir))} is in use by another run \(pid {pid} on "
    rf"{re.escape(socket.gethostname())}, started \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d "
    r"\w+\); wait for it or pass another --workdir"
  )


def _hold_lock(workdir):
  """A child process that holds ``workdir``'s lock until killed."""
  proc = subprocess.Popen(
    [sys.executable, "-c", HOLDER, str(workdir)], cwd=h.REPO, stdout=subprocess.PIPE, text=True
  )
  assert proc.stdout.readline().strip() == "held"
  return proc


def _config(**rl):
  c = h.smoke_config(**rl)
  validate(c)  # complete, as experiment.run compares it
  return c


def _fake_workdir(workdir, config):
  """A workdir as a finished run of ``config`` leaves it (stage outputs as small files)."""
  os.makedirs(workdir, exist_ok=True)
  workdir_lib.write_config(str(workdir), config)
  workdir_lib.reconcile(str(workdir), config)  # stages.json
  for name in ("pretrain", "tokenizer", "rl", "eval"):
    os.makedirs(workdir / name)
    (workdir / name / "data").write_text(name)
  for name in ("summary.json", "curves.png"):
    (workdir / name).write_text(name)


# -- one run per workdir -------------------------------------------------------------------------
def test_held_lock_refuses_a_run_that_writes_nothing_and_a_killed_holder_blocks_nothing(tmp_path):
  workdir = tmp_path / "w"
  holder = _hold_lock(workdir)
  try:
    before = h.tree(workdir)
    with pytest.raises(ConfigError) as e:
      methods_lib.run(h.smoke_config(), str(workdir))
    assert re.fullmatch(_in_use(workdir, holder.pid), str(e.value)), str(e.value)
    assert h.tree(workdir) == before and sorted(before) == [".lock"]
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  # The killed holder's lock file stays, naming it; the kernel released its lock.
  assert (workdir / ".lock").read_text().startswith(f"pid {holder.pid} on ")
  with workdir_lib.lock(str(workdir)):
    assert (workdir / ".lock").read_text().startswith(f"pid {os.getpid()} on ")


def test_a_locked_workdir_stops_every_process_of_a_multi_process_run(tmp_path):
  """Process 0 finds the lock taken; process 1 stops too instead of waiting at a barrier."""
  workdir = tmp_path / "w"
  holder = _hold_lock(workdir)
  script = os.path.join(h.REPO, "tests", "parallel", "multihost_check.py")
  coordinator = f"127.0.0.1:{h.free_port()}"
  procs = [
    subprocess.Popen(
      [sys.executable, script, str(i), "2", coordinator, str(workdir)],
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      env=h.cpu_env(),
    )
    for i in range(2)
  ]
  try:
    outputs = [p.communicate(timeout=180)[0] for p in procs]
  finally:
    for p in (*procs, holder):
      if p.poll() is None:
        p.kill()
        p.wait()
  assert [p.returncode for p in procs] == [1, 1], outputs
  (line,) = [l for l in outputs[0].splitlines() if l.startswith("posttrain_jax")]
  assert re.fullmatch(
    r"posttrain_jax.registry.ConfigError: " + _in_use(workdir, holder.pid), line
  ), line
  assert f"ConfigError: process 0 could not lock workdir {workdir}; see its error" in outputs[1], (
    outputs[1][-2000:]
  )
  assert sorted(h.tree(workdir)) == [".lock"]


def test_only_process_0_locks(tmp_path, monkeypatch):
  monkeypatch.setattr(parallel, "is_primary", lambda: False)
  with workdir_lib.lock(str(tmp_path / "w")):
    assert not (tmp_path / "w").exists()


# -- the stored config (no training: hand-made workdirs) -----------------------------------------
def test_changed_result_keys_are_refused_naming_them_and_the_stages(tmp_path):
  _fake_workdir(tmp_path, _config())
  stored, before = (tmp_path / "config.json").read_text(), h.tree(tmp_path)
  with pytest.raises(ConfigError) as e:
    workdir_lib.reconcile(str(tmp_path), _config(lr=0.01, steps=8))
  assert str(e.value) == (
    f"workdir {tmp_path} was made with a different config: rl.lr 0.0001 -> 0.01, rl.steps 4 "
    "-> 8; pass --rerun to rerun the stages they affect (rl, eval), or use another --workdir"
  )
  seed = _config()
  seed.seed, seed.eval.pass_k = 3, 1
  with pytest.raises(
    ConfigError,
    match=r"config: eval.pass_k 2 -> 1, seed 0 -> 3; pass --rerun"
    r" to rerun the stages they affect \(pretrain, rl, eval\)",
  ):
    workdir_lib.reconcile(str(tmp_path), seed)
  longer = _config(max_new_tokens=9)  # pretraining's sequence length
  with pytest.raises(ConfigError, match=r"rl.max_new_tokens 6 -> 9; .*\(pretrain, rl, eval\)"):
    workdir_lib.reconcile(str(tmp_path), longer)
  heldout = _config()  # widens the tokenizer the old model was trained with
  heldout.eval.heldout_env = "tron/parity"
  with pytest.raises(
    ConfigError,
    match=r'eval.heldout_env "" -> "tron/parity"; .*\(pretrain, '
    r'rl, eval\)',
  ):
    workdir_lib.reconcile(str(tmp_path), heldout)
  evaluation = _config()
  evaluation.eval.pass_n = 8
  with pytest.raises(ConfigError, match=r"eval.pass_n 4 -> 8; .* affect \(eval\)"):
    workdir_lib.reconcile(str(tmp_path), evaluation)
  assert h.tree(tmp_path) == before and (tmp_path / "config.json").read_text() == stored


def test_keys_that_change_nothing_are_allowed_and_config_json_is_kept(tmp_path):
  _fake_workdir(tmp_path, _config())
  before = h.tree(tmp_path)
  c = _config(checkpoint_every=1)
  c.progress, c.tensorboard, c.executable_cache = True, True, False
  c.compilation_cache_dir = str(tmp_path / "cache")
  c.model.remat, c.pretrain.checkpoint_every = True, 1
  c.mesh.shape = (1, 1, 1)
  assert workdir_lib.differences(str(tmp_path), c) == []
  workdir_lib.reconcile(str(tmp_path), c)
  assert h.tree(tmp_path) == before


def test_config_json_of_an_older_version_is_completed_from_the_defaults(tmp_path):
  c = _config()
  _fake_workdir(tmp_path, c)
  old = json.loads((tmp_path / "config.json").read_text())
  del old["rl"]["trim_completions"], old["rl"]["async_rollouts"], old["model"]["attention_impl"]
  del old["eval"]["heldout_env"]
  old["rl"]["retired_knob"] = 1  # a key this version no longer has
  (tmp_path / "config.json").write_text(json.dumps(old))
  assert workdir_lib.differences(str(tmp_path), c) == []
  # A key removed from a free-form section is a change.
  old["rl"]["advantage_kwargs"] = {"eps": 0.5}
  (tmp_path / "config.json").write_text(json.dumps(old))
  assert workdir_lib.differences(str(tmp_path), c) == [
    ("rl.advantage_kwargs.eps 0.5 -> (unset)", "rl")
  ]


@pytest.mark.parametrize(
  "text,problem",
  [("{\"seed\": 0, ", "Expecting property name"), ("[1, 2]", "a JSON list, not an object")],
)
def test_unreadable_config_json_is_refused_and_moving_it_away_works(tmp_path, text, problem):
  c = _config()
  _fake_workdir(tmp_path, c)
  (tmp_path / "config.json").write_text(text)
  with pytest.raises(ConfigError) as e:
    workdir_lib.reconcile(str(tmp_path), c)
  assert str(e.value).startswith(f"{tmp_path / 'config.json'} is unreadable ({problem}")
  assert str(e.value).endswith(
    "); move it away (this run's config then becomes the workdir's), or use another --workdir"
  )
  os.rename(tmp_path / "config.json", tmp_path / "config.json.bad")  # the advice
  workdir_lib.reconcile(str(tmp_path), c)
  assert workdir_lib.differences(str(tmp_path), c) == []
  assert (tmp_path / "config.json").read_text() == c.to_json_best_effort(indent=2)


def test_rerun_moves_exactly_the_affected_outputs_aside(tmp_path, capsys):
  _fake_workdir(tmp_path, _config())
  old_config = (tmp_path / "config.json").read_text()
  new = _config()
  new.seed = 3
  workdir_lib.reconcile(str(tmp_path), new, rerun=True)
  (stamp,) = os.listdir(tmp_path / "replaced")
  moved = tmp_path / "replaced" / stamp
  assert sorted(os.listdir(moved)) == [
    "config.json",
    "curves.png",
    "eval",
    "pretrain",
    "rl",
    "summary.json",
    "tokenizer",
  ]
  assert (moved / "config.json").read_text() == old_config
  assert {k: v.decode() for k, v in h.tree(moved).items() if k != "config.json"} == {
    "curves.png": "curves.png",
    "summary.json": "summary.json",
    "eval/data": "eval",
    "pretrain/data": "pretrain",
    "rl/data": "rl",
    "tokenizer/data": "tokenizer",
  }
  assert sorted(os.listdir(tmp_path)) == ["config.json", "replaced", "stages.json"]
  assert json.loads((tmp_path / "config.json").read_text())["seed"] == 3
  assert workdir_lib.differences(str(tmp_path), new) == []
  assert f"rerunning pretrain, rl, eval; the old outputs are in {moved}" in capsys.readouterr().err


def test_change_before_the_stage_it_affects_started_updates_config_json(tmp_path, capsys):
  c = _config()
  _fake_workdir(tmp_path, c)
  for name in ("rl", "eval", "summary.json", "curves.png"):  # killed during pretraining
    shutil.rmtree(tmp_path / name) if (tmp_path / name).is_dir() else os.remove(tmp_path / name)
  workdir_lib.reconcile(str(tmp_path), _config(lr=0.01))
  assert json.loads((tmp_path / "config.json").read_text())["rl"]["lr"] == 0.01
  assert not (tmp_path / "replaced").exists()
  assert "config changed (rl.lr 0.0001 -> 0.01) before any stage it affects started" in (
    capsys.readouterr().err
  )


def _with_stages(*stages):
  c = _config()
  c.stages = stages
  return c


def test_stage_subsets_are_the_same_config_unless_a_started_stage_would_change_inputs(tmp_path):
  full = tmp_path / "full"
  _fake_workdir(full, _config())
  workdir_lib.reconcile(str(full), _with_stages("pretrain"))  # a subset: nothing changes
  workdir_lib.reconcile(str(full), _with_stages("pretrain", "rl"))
  with pytest.raises(  # the list is the run order: evaluating first changes eval's inputs
    ConfigError,
    match=r"config: stages: eval ran after \(pretrain, rl\), this run puts it after no stage",
  ):
    workdir_lib.reconcile(str(full), _with_stages("eval", "rl", "pretrain"))
  with pytest.raises(
    ConfigError,
    match=r"config: stages: rl ran after \(pretrain\), this run "
    r"puts it after no stage; pass --rerun to rerun the "
    r"stages they affect \(rl, eval\)",
  ):
    workdir_lib.reconcile(str(full), _with_stages("rl", "eval"))
  # Pretraining alone first, then the rest: the later stages run after it, as recorded.
  split = tmp_path / "split"
  split.mkdir()
  workdir_lib.reconcile(str(split), _with_stages("pretrain"))
  os.makedirs(split / "pretrain")
  workdir_lib.reconcile(str(split), _config())
  assert json.loads((split / "stages.json").read_text()) == {
    "pretrain": [],
    "rl": ["pretrain"],
    "eval": ["pretrain", "rl"],
  }
  # RL from the initial parameters first: pretraining before it later changes its input.
  scratch = tmp_path / "scratch"
  scratch.mkdir()
  workdir_lib.reconcile(str(scratch), _with_stages("rl", "eval"))
  os.makedirs(scratch / "rl")
  with pytest.raises(
    ConfigError,
    match=r"stages: rl ran after no stage, this run puts it after "
    r"\(pretrain\); pass --rerun to rerun the stages they "
    r"affect \(rl, eval\)",
  ):
    workdir_lib.reconcile(str(scratch), _config())


# -- real runs ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """An uninterrupted in-process run of the smoke config: (workdir, summary)."""
  workdir = tmp_path_factory.mktemp("reference")
  return workdir, methods_lib.run(h.smoke_config(), str(workdir))


def _same_results(workdir, reference_dir):
  for stage in ("pretrain", "rl"):
    assert h.records(workdir / stage / "metrics.jsonl") == h.records(
      reference_dir / stage / "metrics.jsonl"
    ), stage
  assert json.loads((workdir / "summary.json").read_text()) == json.loads(
    (reference_dir / "summary.json").read_text()
  )


def test_second_run_into_a_running_workdir_is_refused_and_the_first_is_intact(reference, tmp_path):
  """Two runs of the smoke config into one new workdir, started together (so that neither can
  finish before the other reaches the lock, however warm the caches): the one that took the
  lock finishes with an uninterrupted run's records; the other is refused with one line."""
  workdir = tmp_path / "w"
  procs = [
    subprocess.Popen(
      h.cmd(workdir),
      cwd=h.REPO,
      env=h.env(),
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
      text=True,
    )
    for _ in range(2)
  ]
  try:
    errs = [p.communicate(timeout=600)[1] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  assert sorted(p.returncode for p in procs) == [0, 2], errs
  first, second = sorted(range(2), key=lambda i: procs[i].returncode)
  assert "Traceback" not in errs[second]
  (line,) = [l for l in errs[second].splitlines() if "error" in l.lower()]
  assert re.fullmatch("error: " + _in_use(workdir, procs[first].pid), line), line
  _same_results(workdir, reference[0])


def test_changed_config_is_refused_by_main_and_rerun_follows_the_advice(reference, tmp_path):
  ref_dir, _ = reference
  workdir = tmp_path / "w"
  shutil.copytree(ref_dir, workdir, symlinks=True)
  before = h.tree(workdir)
  proc = h.run_main(workdir, "--config.rl.lr=0.01", "--config.rl.steps=2")
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  (line,) = [l for l in proc.stderr.splitlines() if "error" in l.lower()]
  assert line == (
    f"error: workdir {workdir} was made with a different config: rl.lr 0.0001 -> "
    "0.01, rl.steps 4 -> 2; pass --rerun to rerun the stages they affect (rl, "
    "eval), or use another --workdir"
  )
  after = h.tree(workdir)
  assert {k: v for k, v in after.items() if k != ".lock"} == {
    k: v for k, v in before.items() if k != ".lock"
  }
  # The advice: --rerun (here in process) reruns RL and evaluation, keeps pretraining.
  summary = methods_lib.run(h.smoke_config(lr=0.01, steps=2), str(workdir), rerun=True)
  (stamp,) = os.listdir(workdir / "replaced")
  moved = workdir / "replaced" / stamp
  assert sorted(os.listdir(moved)) == ["config.json", "curves.png", "eval", "rl", "summary.json"]
  assert h.tree(moved) == {k: v for k, v in before.items() if k.split("/")[0] in os.listdir(moved)}
  now = h.tree(workdir)
  for key in before:
    if key.split("/")[0] in ("pretrain", "tokenizer"):
      assert now[key] == before[key], key  # bit-identical
  assert not [k for k in now if k.split("/")[0] in ("pretrain", "tokenizer") and k not in before]
  fresh = tmp_path / "fresh"
  assert summary == methods_lib.run(h.smoke_config(lr=0.01, steps=2), str(fresh))
  _same_results(workdir, fresh)
  assert (workdir / "config.json").read_text() == (fresh / "config.json").read_text()


def test_display_only_change_reruns_nothing(reference, tmp_path):
  ref_dir, summary = reference
  workdir = tmp_path / "w"
  shutil.copytree(ref_dir, workdir, symlinks=True)
  before = h.tree(workdir)
  c = h.smoke_config(checkpoint_every=1)
  c.tensorboard, c.executable_cache = True, False
  assert methods_lib.run(c, str(workdir)) == summary
  after = h.tree(workdir)
  for key, value in before.items():
    if key.split("/")[0] in ("config.json", "pretrain", "rl", "tokenizer", "stages.json"):
      assert after[key] == value, key
  assert not (workdir / "replaced").exists()
