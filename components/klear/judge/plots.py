"""Histogram PNGs for the reports of judge, sft-data and rl-filter (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def histogram_png(path: Path, series: Mapping[str, Sequence[float]], bins: int | Sequence[float], title: str,
                  xlabel: str, log_y: bool = False) -> Path:
    """One histogram with a bar series per label (stacked), saved to `path`. Empty series still give a figure."""
    import matplotlib

    matplotlib.use("Agg")  # no display in a pod
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    labels = [label for label, values in series.items() if len(values)]
    if labels:
        ax.hist([list(series[label]) for label in labels], bins=bins, stacked=True, label=labels)
        if len(labels) > 1:
            ax.legend()
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    if log_y and labels:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("count")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
