"""A terminal progress bar with live metrics, and plain-text result tables."""

import os
import sys

from tqdm.auto import tqdm


class Progress:
  """tqdm bar over ``[initial, total)`` steps that shows chosen metrics as a postfix."""

  def __init__(self, total: int, *, initial: int = 0, desc: str = "", keys=(), enabled=True):
    self.keys = tuple(keys)
    self._bar = tqdm(
      total=total,
      initial=initial,
      desc=desc,
      dynamic_ncols=True,
      disable=not enabled,
      file=sys.stderr,
      mininterval=0.5,
    )

  def update(self, metrics: dict, n: int = 1) -> None:
    shown = {k.split("/")[-1]: f"{float(metrics[k]):.3f}" for k in self.keys if k in metrics}
    if shown:
      self._bar.set_postfix(shown, refresh=False)
    self._bar.update(n)

  def close(self) -> None:
    self._bar.close()


def format_table(header: list[str], rows: list[list]) -> str:
  """A markdown table; floats printed with 4 significant decimals."""

  def cell(x):
    return f"{x:.4f}" if isinstance(x, float) else str(x)

  lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
  lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
  return "\n".join(lines)


def write_report(path: str, title: str, paragraphs: list[str], command: str) -> str:
  """Writes a script's markdown report to ``path``: ``# title``, the paragraphs (text or
  :func:`format_table` output) and the command that rebuilds it; returns the text."""
  text = "\n\n".join([f"# {title}", *paragraphs, f"Command: `{command}`"]) + "\n"
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
  return text
