"""Issue 37, item 1: damaged workdir files. A crash can tear only the last line of an
append-only record, which a resume drops with a warning and rewrites (the records then equal an
uninterrupted run's); any other damage to a record is one line naming the file, the line and
the fix; the TensorBoard event log holds one point per step after a resume; a damaged tokenizer
folder is rebuilt from the config."""

import os
import shutil
import struct

import faults_finite_helpers as h
import pytest

from posttrain_jax import main as main_lib
from posttrain_jax import methods as methods_lib
from posttrain_jax.io import DamagedFileError, read_jsonl
from posttrain_jax.io import metrics as metrics_lib


class Crash(Exception):
  pass


@pytest.fixture(scope="module")
def full_ref(tmp_path_factory):
  """An uninterrupted smoke run."""
  workdir = tmp_path_factory.mktemp("full_ref")
  methods_lib.run(h.smoke_config(), str(workdir))
  return workdir


def _crash_after_rl_step(monkeypatch, step: int):
  """The next run raises right after writing RL step ``step``'s record."""
  write = metrics_lib.MetricWriter.write

  def crashing(self, s, metrics):
    record = write(self, s, metrics)
    if os.path.basename(os.path.dirname(self.path)) == "rl" and s == step:
      raise Crash(f"after rl step {s}")
    return record

  monkeypatch.setattr(metrics_lib.MetricWriter, "write", crashing)


def _tb_points(directory) -> list[tuple[str, int]]:
  """Every (tag, step) scalar in the TFRecord event files under ``directory``."""
  from tensorboardX.proto import event_pb2

  points = []
  for name in sorted(os.listdir(directory)):
    with open(os.path.join(directory, name), "rb") as f:
      data = f.read()
    i = 0
    while i < len(data):  # length (8 bytes), its crc (4), the event, its crc (4)
      (n,) = struct.unpack("<Q", data[i : i + 8])
      event = event_pb2.Event.FromString(data[i + 12 : i + 12 + n])
      points += [(v.tag, event.step) for v in event.summary.value]
      i += 12 + n + 4
  return points


def test_a_torn_last_line_is_dropped_with_a_warning_and_the_resume_matches(
  tmp_path, full_ref, monkeypatch, capsys
):
  config = h.smoke_config(tensorboard=True)
  _crash_after_rl_step(monkeypatch, 3)
  with pytest.raises(Crash):
    methods_lib.run(config, str(tmp_path))
  monkeypatch.undo()
  path = tmp_path / "rl" / "metrics.jsonl"
  with open(path, "a", encoding="utf-8") as f:  # what a kill in the middle of an append leaves
    f.write('{"step": 4, "loss/pg": 0.12')
  capsys.readouterr()
  methods_lib.run(config, str(tmp_path))
  err = capsys.readouterr().err
  assert f"warning: {path}: dropped its torn last line" in err
  assert h.records(path) == h.records(full_ref / "rl" / "metrics.jsonl")
  # the event log was rebuilt at the resume: exactly one point per (tag, step) of the records
  points = _tb_points(tmp_path / "rl" / "tb" / "metrics")
  want = [
    (k, r["step"])
    for r in read_jsonl(str(path))
    for k, v in r.items()
    if k != "step" and isinstance(v, (int, float))
  ]
  assert len(points) == len(set(points)) and sorted(points) == sorted(want)


def test_a_damaged_line_before_intact_records_is_one_line_naming_it(tmp_path, monkeypatch):
  _crash_after_rl_step(monkeypatch, 3)
  with pytest.raises(Crash):
    methods_lib.run(h.smoke_config(), str(tmp_path))
  monkeypatch.undo()
  path = tmp_path / "rl" / "metrics.jsonl"
  lines = path.read_text().splitlines()
  lines[1] = lines[1][:20]
  path.write_text("\n".join(lines) + "\n")
  before = path.read_text()
  with pytest.raises(DamagedFileError) as err:
    methods_lib.run(h.smoke_config(), str(tmp_path))
  line = main_lib.user_message(err.value, str(tmp_path))
  assert line.startswith(f"{path}:2 is damaged (")
  assert line.endswith(
    f"and {len(lines) - 2} intact record(s) follow it; a crash only tears the last line, so "
    "the file was changed by hand or the disk is failing: delete line 2 (its record is lost) "
    "and rerun the same command"
  )
  assert path.read_text() == before  # nothing rewritten or lost
  lines.pop(1)  # the advised fix: the run then resumes and completes
  path.write_text("\n".join(lines) + "\n")
  methods_lib.run(h.smoke_config(), str(tmp_path))
  assert (tmp_path / "rl" / "done.json").exists()


@pytest.mark.parametrize("kind", ["", "[1, 2]\n", "not json\n"])
def test_read_jsonl_classes(tmp_path, kind, capsys):
  path = tmp_path / "m.jsonl"
  path.write_text('{"step": 0}\n' + kind + '{"step": 2}\n')
  if not kind:
    assert [r["step"] for r in read_jsonl(str(path))] == [0, 2]
  else:
    with pytest.raises(DamagedFileError, match=f"{path}:2 is damaged"):
      read_jsonl(str(path))
  path.write_text('{"step": 0}\n' + (kind.strip() or '{"step'))  # torn last: dropped
  assert read_jsonl(str(path)) == [{"step": 0}]
  assert "dropped its torn last line 2" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["empty", "truncated"])
def test_a_damaged_tokenizer_folder_is_rebuilt_from_the_config(tmp_path, full_ref, damage, capsys):
  work = tmp_path / "w"
  shutil.copytree(full_ref, work)
  tok = work / "tokenizer"
  original = (tok / "tokenizer.json").read_bytes()
  if damage == "empty":
    for name in os.listdir(tok):
      os.remove(tok / name)
  else:
    (tok / "tokenizer.json").write_bytes(original[: len(original) // 2])
  capsys.readouterr()
  methods_lib.run(h.smoke_config(), str(work))
  err = capsys.readouterr().err
  assert f"warning: the tokenizer folder {tok} cannot be loaded (" in err
  assert "rebuilt it from the config" in err
  assert (tok / "tokenizer.json").read_bytes() == original
  assert h.summary(work) == h.summary(full_ref)
