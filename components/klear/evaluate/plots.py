"""The report's figures (matplotlib, headless): scores with error bars beside the paper's, response lengths of
correct and wrong samples, per-problem pass counts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["length_histograms", "pass_count_chart", "score_chart"]

_PAPER_MARKERS = ("v", "o", "*")
_MAX_TICKED_PROBLEMS = 40  # problem ids on the x axis up to this many; beyond, ranks only


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display in a pod
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path, dpi: int) -> Path:
    plt = _pyplot()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def score_chart(path: Path, titles: Mapping[str, str], scores: Mapping[str, Mapping[str, tuple[float, float | None]]],
                paper: Mapping[str, Mapping[str, float]], dpi: int = 100) -> Path:
    """Grouped bars: per benchmark (titles: name -> title) one bar per label (scores: label -> benchmark ->
    (pass@1, stderr)) with its error bar, and the paper's values (row -> benchmark -> value) as markers."""
    plt = _pyplot()
    names = list(titles)
    labels = list(scores)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.9 * len(names) + 2), 4.4))
    width = 0.8 / max(1, len(labels))
    for j, label in enumerate(labels):
        xs, ys, errs = [], [], []
        for i, name in enumerate(names):
            value = scores[label].get(name)
            if value is not None:
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(value[0])
                errs.append(value[1] or 0.0)
        bars = ax.bar(xs, ys, width, yerr=errs, capsize=4, label=label)
        for bar, y in zip(bars, ys):
            ax.annotate(f"{y:.1f}", (bar.get_x() + bar.get_width() / 2, y), xytext=(0, 3), textcoords="offset points",
                        ha="center", va="bottom", fontsize=8)
    for marker, (row, values) in zip(_PAPER_MARKERS, paper.items()):
        points = [(i, values[name]) for i, name in enumerate(names) if name in values]
        if points:
            ax.scatter([p[0] for p in points], [p[1] for p in points], marker=marker, s=60, color="black",
                       zorder=3, label=row)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([titles[n] for n in names], rotation=15 if len(names) > 4 else 0)
    ax.set_ylim(0, 105)
    ax.set_ylabel("pass@1 (avg@k), % ± standard error")
    ax.set_title("Scores beside the paper's Table 1")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, path, dpi)


def length_histograms(path: Path, label: str, titles: Mapping[str, str],
                      lengths: Mapping[str, Mapping[str, Sequence[int]]], dpi: int = 100) -> Path:
    """One panel per benchmark: response lengths (completion tokens) of correct and of wrong samples."""
    plt = _pyplot()
    names = list(lengths) or ["-"]
    cols = min(3, len(names))
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.3 * rows), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, names):
        series = lengths.get(name, {})
        drawn = False
        values = [v for part in series.values() for v in part]
        if values:
            top = max(values)
            bins = [top * i / 30 for i in range(31)] if top > 0 else 10
            for outcome, color in (("correct", "tab:green"), ("wrong", "tab:red")):
                part = list(series.get(outcome, ()))
                if part:
                    ax.hist(part, bins=bins, alpha=0.6, color=color, label=f"{outcome} ({len(part)})")
                    drawn = True
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no token counts", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(titles.get(name, name), fontsize=10)
        ax.set_xlabel("response tokens")
        ax.set_ylabel("samples")
    fig.suptitle(f"Response lengths, correct vs wrong: {label}")
    return _save(fig, path, dpi)


def pass_count_chart(path: Path, titles: Mapping[str, str], ks: Mapping[str, int],
                     counts: Mapping[str, Mapping[str, Mapping[str, int]]], dpi: int = 100) -> Path:
    """One panel per benchmark: each problem's correct samples out of k, one bar per label (counts: label ->
    benchmark -> problem id -> correct), problems ordered by the first label's count."""
    plt = _pyplot()
    names = list(titles) or ["-"]
    labels = list(counts)
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 2.6 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        first = counts[labels[0]].get(name, {}) if labels else {}
        ids = sorted({pid for label in labels for pid in counts[label].get(name, {})},
                     key=lambda pid: (-first.get(pid, -1), pid))
        width = 0.8 / max(1, len(labels))
        for j, label in enumerate(labels):
            values = counts[label].get(name, {})
            ax.bar([i - 0.4 + width * (j + 0.5) for i in range(len(ids))], [values.get(pid, 0) for pid in ids],
                   width, label=label)
        if len(ids) <= _MAX_TICKED_PROBLEMS:
            ax.set_xticks(range(len(ids)))
            ax.set_xticklabels(ids, rotation=90, fontsize=6)
        else:
            ax.set_xlabel(f"{len(ids)} problems, by {labels[0] if labels else ''}'s count")
        ax.set_ylim(0, ks.get(name, 1) * 1.05)
        ax.set_ylabel(f"correct of {ks.get(name, '?')}")
        ax.set_title(titles.get(name, name), fontsize=10)
        if len(labels) > 1:
            ax.legend(fontsize=8)
    fig.suptitle("Per-problem pass counts")
    return _save(fig, path, dpi)
