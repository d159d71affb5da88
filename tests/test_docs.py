"""The documentation cannot drift: the generated registry reference, relative links, the config
table against the defaults, and the README's verdicts against the results tables."""

import glob
import os
import re

import pytest

from posttrain_jax import docgen

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def _gen_reference():
  return docgen


def _doc_files():
  return [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))


def _without_code(text: str) -> str:
  """Markdown text with fenced code blocks and inline code spans removed."""
  text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
  return re.sub(r"`[^`\n]*`", "", text)


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def broken_links(path: str):
  """Relative link targets in the Markdown file ``path`` that name no existing file."""
  with open(path, encoding="utf-8") as f:
    text = _without_code(f.read())
  broken = []
  for target in LINK.findall(text):
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
      continue  # http(s):, mailto:, or an anchor in the same file
    file_part = target.split("#", 1)[0]
    if not os.path.exists(os.path.join(os.path.dirname(path), file_part)):
      broken.append(target)
  return broken


def test_reference_is_up_to_date():
  ok, message = _gen_reference().check()
  assert ok, message


def test_check_reports_a_stale_file(tmp_path):
  gen = _gen_reference()
  stale = tmp_path / "reference.md"
  stale.write_text("# stale\n", encoding="utf-8")
  ok, message = gen.check(str(stale))
  assert not ok
  assert message == "docs/reference.md is out of date; run python scripts/gen_reference.py"


def test_reference_lists_the_registries():
  names = [q for q, _, _ in _gen_reference().find_registries()]
  for expected in (
    "objectives.ADVANTAGES",
    "objectives.POLICY_LOSSES",
    "objectives.KL_ESTIMATORS",
    "objectives.AGGREGATIONS",
    "scheduling.SCHEDULERS",
    "envs.ENVS",
    "models.PRESETS",
  ):
    assert expected in names, f"{expected} missing from docs/reference.md's registries: {names}"


@pytest.mark.parametrize("path", _doc_files(), ids=lambda p: os.path.relpath(p, REPO))
def test_relative_links_exist(path):
  broken = broken_links(path)
  assert not broken, f"{os.path.relpath(path, REPO)} links to missing files: {broken}"


def test_broken_link_is_caught(tmp_path):
  page = tmp_path / "page.md"
  (tmp_path / "there.md").write_text("x", encoding="utf-8")
  page.write_text(
    "[ok](there.md#a) [web](https://x.org) [anchor](#top) `[code](nothing.md)`\n"
    "[bad](missing/file.md)\n",
    encoding="utf-8",
  )
  assert broken_links(str(page)) == ["missing/file.md"]


def _table_rows(text: str, first_header: str):
  """Rows (lists of cells) of the Markdown table whose header row starts with ``first_header``."""
  lines = text.split("\n")
  start = next(i for i, line in enumerate(lines) if line.startswith("| " + first_header + " |"))
  header = [c.strip() for c in lines[start].strip().strip("|").split(" | ")]
  rows = []
  for line in lines[start + 2 :]:
    if not line.startswith("|"):
      break
    rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
  return header, rows


def test_config_table_lists_every_declared_key_with_a_description():
  from posttrain_jax import defaults

  with open(os.path.join(REPO, "docs", "config.md"), encoding="utf-8") as f:
    _, rows = _table_rows(f.read(), "key")
  documented = {row[0].strip("`"): row for row in rows}
  assert set(documented) == set(defaults.KEYS) == set(_gen_reference().config_defaults())
  assert all(row[3] for row in rows), "every key in docs/config.md needs a description"


def results_verdict(table_md: str) -> str:
  """The verdict a results/NAME/table.md states: the end of its 'Claim: ...' line."""
  with open(table_md, encoding="utf-8") as f:
    claim = next(line for line in f if line.startswith("Claim:"))
  return claim.strip().rsplit(": ", 1)[1].rstrip(".")


def test_results_index_in_readme_and_experiments_doc_is_up_to_date():
  """The README's and docs/experiments.md's results tables are generated from results/ (no
  number typed): regenerating them changes nothing, and their verdicts are the tables'."""
  from posttrain_jax.sweeps import index

  for path, text in index.documents().items():
    with open(path, encoding="utf-8") as f:
      assert f.read() == text, index.OUT_OF_DATE.format(os.path.relpath(path, REPO))
  with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
    header, rows = _table_rows(f.read(), "setting")
  verdict, table = header.index("verdict"), header.index("table")
  for row in rows:
    name = re.search(r"\(results/([^/)]+)/table\.md\)", row[table]).group(1)
    expected = results_verdict(os.path.join(REPO, "results", name, "table.md"))
    # the index adds the declared mechanism check's count when it engaged in too few seeds
    assert row[verdict].split(" (mechanism")[0] == expected, (name, row[verdict], expected)
  assert len(rows) == len(index.names()) >= 20


def _table_names():
  from posttrain_jax.sweeps import index

  return index.names()


@pytest.mark.parametrize("name", _table_names())
def test_every_table_recomputes_from_its_committed_files(name):
  """results/NAME/table.md is what the current rule and config write from the runs.jsonl (and
  bases.jsonl) committed beside it: every number and the verdict."""
  from posttrain_jax.sweeps import index

  with open(os.path.join(REPO, "results", name, "table.md"), encoding="utf-8") as f:
    committed = f.read()
  assert index.recompute(name) == committed, (
    f"results/{name}/table.md differs from its recomputation: rerun "
    f"python scripts/reproduce.py experiments/{name}.py --report-only"
  )
  assert index.judged(name)[0] == results_verdict(os.path.join(REPO, "results", name, "table.md"))


@pytest.mark.parametrize("name", _table_names())
def test_config_notes_state_settings_and_reasons_not_results(name):
  """A config's notes are printed under its table and copied by every rerun, so they must not
  carry results (an interpretation with p-values or a verdict goes stale the moment the runs
  change): the table computes those."""
  from posttrain_jax.sweeps import index

  _, sweep, _, _ = index.load(name)
  for note in sweep.get("notes", ()):
    found = re.search(r"\bp ?[=<]|[Ii]nterpretation|[Vv]erdict|[Rr]eading of the", note)
    assert found is None, f"experiments/{name}.py note carries a result ({found.group()!r}): {note}"
