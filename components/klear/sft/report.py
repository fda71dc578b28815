"""The sft report as KFP metrics and as Markdown for the run's UI page."""

from __future__ import annotations

from typing import Any

from klear.common.markdown import markdown_report
from klear.training import report as common

EXTRA_METRICS: tuple[common.Extra, ...] = (("train_tokens_per_epoch", "data", "tokens"),)


def metric_items(report: dict[str, Any]) -> list[tuple[str, float]]:
    return common.metric_items(report, EXTRA_METRICS)


@markdown_report
def render_markdown(report: dict[str, Any]) -> str:
    data, training = report["data"], report["training"]
    lines = [
        "# SFT",
        "",
        f"Records: {data['read']} read, {data['kept']} trained on ({data['tokens']} tokens per epoch).",
        "",
        *common.skipped_table(data),
        "",
        f"{common.steps_line(training)}, epochs {training['epochs']:.2f}.",
        "",
        *common.metrics_table(report["metrics"]),
        "",
    ]
    return "\n".join(lines)
