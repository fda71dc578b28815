"""The parts of a training stage's report every stage shares: the KFP metrics and the Markdown tables (torch-free).

A report has the blocks `data` (read, kept, skipped by reason), `training` (global_step, max_steps,
resumed_from_step, ...), `metrics` (final figures) and `config`; a stage may add its own blocks.
"""

from __future__ import annotations

import math
from typing import Any

# (metric name, report block, key): figures a stage adds to the common ones, e.g. ("fill_ratio_min", "training", ...)
Extra = tuple[str, str, str]


def metric_items(report: dict[str, Any], extra: tuple[Extra, ...] = ()) -> list[tuple[str, float]]:
    """Flat (name, number) pairs: data counts, steps, the stage's extra figures, the final metrics.
    NaN and inf are left out (KFP rejects them)."""
    data, training = report["data"], report["training"]
    items: list[tuple[str, Any]] = [("records_read", data["read"]), ("records_kept", data["kept"])]
    items += [(name, report[block][key]) for name, block, key in extra]
    items += [(f"skipped_{reason}", count) for reason, count in sorted(data["skipped"].items())]
    items += [("global_step", training["global_step"]), ("resumed_from_step", training["resumed_from_step"])]
    items += sorted(report["metrics"].items())
    return [(name, float(value)) for name, value in items if math.isfinite(float(value))]


def skipped_table(data: dict[str, Any]) -> list[str]:
    return ["| skipped because | records |", "|---|---|",
            *(f"| {reason} | {count} |" for reason, count in sorted(data["skipped"].items()))]


def steps_line(training: dict[str, Any]) -> str:
    """'Optimizer steps: N of M[, resumed from step K]' (no final period: stages append to it)."""
    resumed = training["resumed_from_step"]
    return (f"Optimizer steps: {training['global_step']} of {training['max_steps']}"
            + (f", resumed from step {resumed}" if resumed else ""))


def metrics_table(metrics: dict[str, float]) -> list[str]:
    return ["| metric | value |", "|---|---|", *(f"| {key} | {value:.6g} |" for key, value in sorted(metrics.items()))]


TOKENS_PER_EPOCH: Extra = ("train_tokens_per_epoch", "data", "tokens")  # of a stage that trains on tokenized records


def records_report_lines(title: str, report: dict[str, Any]) -> list[str]:
    """The Markdown of a stage that trains on records (sft, a generated training stage): records read and trained on
    with their tokens per epoch, the skipped ones by reason, the steps and epochs, the final metrics. The caller's
    renderer is a @markdown_report: the values arrive escaped."""
    data, training = report["data"], report["training"]
    return [f"# {title}", "",
            f"Records: {data['read']} read, {data['kept']} trained on ({data['tokens']} tokens per epoch).", "",
            *skipped_table(data), "", f"{steps_line(training)}, epochs {training['epochs']:.2f}.", "",
            *metrics_table(report["metrics"]), ""]
