"""Learning-curve PNGs from JSONL metric files."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from posttrain_jax.io.metrics import read_jsonl  # noqa: E402


def plot_curves(panels: list[tuple[str, str, list[str]]], out_png: str, *, title: str = "") -> str:
  """One subplot per ``(title, jsonl_path, keys)`` panel, each key a line against ``step``.

  Records without a key are skipped for that line. Returns ``out_png``.
  """
  fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
  for ax, (panel_title, path, keys) in zip(axes[0], panels):
    records = read_jsonl(path)
    for key in keys:
      pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
      if pts:
        xs, ys = zip(*pts)
        ax.plot(xs, ys, label=key, marker="." if len(pts) < 40 else None)
    ax.set_title(panel_title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(out_png, dpi=110)
  plt.close(fig)
  return out_png
