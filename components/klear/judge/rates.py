"""Pass rates: per-problem counts from judged samples, and the histogram bins the reports draw (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from klear.judge.scoring import FAILED_VERDICTS

__all__ = ["PassRate", "PassRateTable", "first_k_pass_rate", "histogram", "pass_rates"]


@dataclass(frozen=True)
class PassRate:
    """One problem's row of the pass-rate table. `pass_rate` = correct / samples; None without a reference."""

    id: str
    kind: str
    samples: int
    correct: int
    pass_rate: float | None
    mean_score: float | None  # code: mean fraction of tests passed; math: equals pass_rate
    truncated: int
    unscored: int  # budget overruns and scorer errors, counted as wrong in `correct`

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class PassRateTable:
    """Streaming accumulator: add judged rows (id, kind, correct, score, verdict), read the table at the end."""

    def __init__(self) -> None:
        self._counts: dict[str, list[Any]] = {}  # id -> [kind, samples, correct, score sum, truncated, unscored]

    def add(self, row: Mapping[str, Any]) -> None:
        c = self._counts.setdefault(str(row["id"]), [row.get("kind") or "none", 0, 0, 0.0, 0, 0])
        if c[0] == "none" and row.get("kind") not in (None, "none"):
            c[0] = row["kind"]
        c[1] += 1
        c[2] += bool(row.get("correct"))
        c[3] += float(row.get("score") or 0.0)
        c[4] += row.get("verdict") == "truncated"
        c[5] += row.get("verdict") in FAILED_VERDICTS

    def __len__(self) -> int:
        return len(self._counts)

    def rows(self) -> list[PassRate]:
        out = []
        for pid, (kind, n, correct, score, truncated, unscored) in self._counts.items():
            judged = kind != "none" and n > 0
            out.append(PassRate(pid, kind, n, correct, correct / n if judged else None, score / n if judged else None,
                                truncated, unscored))
        return out


def pass_rates(rows: Iterable[Mapping[str, Any]]) -> dict[str, PassRate]:
    """Per problem id: samples, correct, pass rate, from judged rows (the judge's output rows)."""
    table = PassRateTable()
    for row in rows:
        table.add(row)
    return {r.id: r for r in table.rows()}


def first_k_pass_rate(judged: Iterable[tuple[int, bool]], k: int | None) -> tuple[int, int]:
    """(correct, counted) over the first `k` samples by index of (sample index, correct) pairs (all if k is None).
    Fixing which samples count keeps a label independent of how many extra samples a rerun produced."""
    chosen = sorted(judged)[:k] if k is not None else list(judged)
    return sum(correct for _, correct in chosen), len(chosen)


def histogram(values: Iterable[float], bins: int = 10, low: float = 0.0, high: float = 1.0) -> list[int]:
    """Counts of `values` in `bins` equal bins over [low, high]; the last bin includes `high`."""
    counts = [0] * bins
    width = (high - low) / bins
    for v in values:
        if v < low or v > high:
            continue
        counts[min(bins - 1, int((v - low) / width))] += 1
    return counts
