"""The sft report as KFP metrics and as Markdown for the run's UI page."""

from __future__ import annotations

import math
from typing import Any


def metric_items(report: dict[str, Any]) -> list[tuple[str, float]]:
    """Flat (name, number) pairs: data counts, steps, final training metrics. NaN/inf are left out (KFP rejects them)."""
    data = report["data"]
    items: list[tuple[str, float]] = [("records_read", data["read"]), ("records_kept", data["kept"]),
                                      ("train_tokens_per_epoch", data["tokens"])]
    items += [(f"skipped_{reason}", count) for reason, count in sorted(data["skipped"].items())]
    items += [("global_step", report["training"]["global_step"]),
              ("resumed_from_step", report["training"]["resumed_from_step"])]
    items += sorted(report["metrics"].items())
    return [(name, float(value)) for name, value in items if math.isfinite(float(value))]


def render_markdown(report: dict[str, Any]) -> str:
    data, training = report["data"], report["training"]
    lines = [
        "# SFT",
        "",
        f"Records: {data['read']} read, {data['kept']} trained on ({data['tokens']} tokens per epoch).",
        "",
        "| skipped because | records |",
        "|---|---|",
        *(f"| {reason} | {count} |" for reason, count in sorted(data["skipped"].items())),
        "",
        f"Optimizer steps: {training['global_step']} of {training['max_steps']}, epochs {training['epochs']:.2f}"
        + (f", resumed from step {training['resumed_from_step']}" if training["resumed_from_step"] else "") + ".",
        "",
        "| metric | value |",
        "|---|---|",
        *(f"| {key} | {value:.6g} |" for key, value in sorted(report["metrics"].items())),
        "",
    ]
    return "\n".join(lines)
