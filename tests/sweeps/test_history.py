"""A table replaced by a rerun moves to its history.md with what changed and why
(sweeps/report.archive, called by reproduce when the runs differ)."""

import json

from posttrain_jax.sweeps import report
from posttrain_jax.sweeps.reproduce import _changed, retire_table

DOC = """Title.

Why this setting exposes the mechanism: it can.

Changed for the rerun (issue 38), before it ran: 5 seeds instead of 3.
"""


def _write(folder, table: str, runs: list[dict]):
  (folder / "table.md").write_text(table)
  (folder / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))


def test_a_rerun_with_other_runs_archives_the_old_table_newest_first(tmp_path):
  old = [{"arm": "a", "seed": 0, "m": 0.5, "wall_s": 10.0, "workdir": "x"}]
  _write(tmp_path, "# T\n\nClaim: c. Verdict: not significant.\n", old)
  same = [dict(old[0], wall_s=99.0, workdir="y")]  # timing and place are not results
  assert not _changed(str(tmp_path), same)
  assert _changed(str(tmp_path), [dict(old[0], m=0.6)])
  reason = report.paragraph(DOC, report.CHANGED)
  assert reason == "Changed for the rerun (issue 38), before it ran: 5 seeds instead of 3."
  report.archive(str(tmp_path), reason, when="2026-12-05", commit="abc1234")
  _write(tmp_path, "# T\n\nClaim: c. Verdict: reproduced.\n", [dict(old[0], m=0.6)])
  report.archive(str(tmp_path), "", when="2026-12-06", commit="def5678")
  text = (tmp_path / "history.md").read_text()
  assert text.startswith("# Earlier versions of table.md\n\n## Replaced on 2026-12-06")
  assert text.index("Verdict: reproduced") < text.index("Verdict: not significant")
  assert "## T" in text and "\n# T" not in text  # the old title sits under its entry
  assert "What changed was not stated in the config." in text and reason in text
  assert text.count("## Replaced on") == 2


def test_a_first_run_has_nothing_to_archive(tmp_path):
  assert not _changed(str(tmp_path), [{"arm": "a", "seed": 0}])


def test_a_replaced_table_takes_its_rerun_check_with_it(tmp_path):
  old = [{"arm": "a", "seed": 0, "m": 0.5}]
  table = "# T\n\nClaim: c. Verdict: reproduced.\nRerun check (seed 0): identical.\n"
  _write(tmp_path, table, old)
  (tmp_path / "rerun.json").write_text("{}")
  (tmp_path / "rerun.md").write_text("# Rerun check: T\n")
  (tmp_path / "check" / "runs").mkdir(parents=True)
  assert not retire_table(str(tmp_path), [dict(old[0])], DOC)  # the same runs: all stays
  assert (tmp_path / "rerun.json").exists() and (tmp_path / "check").exists()
  assert not (tmp_path / "history.md").exists()
  assert retire_table(str(tmp_path), [dict(old[0], m=0.6)], DOC)
  left = sorted(p.name for p in tmp_path.iterdir())
  assert left == ["history.md", "runs.jsonl", "table.md"]  # the check of the old runs went
  history = (tmp_path / "history.md").read_text()
  assert "Rerun check (seed 0): identical." in history and "5 seeds instead of 3" in history
