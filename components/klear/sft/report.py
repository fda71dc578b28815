"""The sft report as KFP metrics and as Markdown for the run's UI page."""

from __future__ import annotations

from typing import Any

from klear.common.markdown import markdown_report
from klear.training import report as common


def metric_items(report: dict[str, Any]) -> list[tuple[str, float]]:
    return common.metric_items(report, (common.TOKENS_PER_EPOCH,))


@markdown_report
def render_markdown(report: dict[str, Any]) -> str:
    return "\n".join(common.records_report_lines("SFT", report))
