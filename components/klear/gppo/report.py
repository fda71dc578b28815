"""The gppo report as KFP metrics and as Markdown for the run's UI page."""

from __future__ import annotations

from typing import Any

from klear.common.markdown import markdown_report
from klear.training import report as common

EXTRA_METRICS: tuple[common.Extra, ...] = (("fill_ratio_min", "training", "fill_ratio_min"),)


def metric_items(report: dict[str, Any]) -> list[tuple[str, float]]:
    return common.metric_items(report, EXTRA_METRICS)


# Rollout figures exist on the steps that generated; the others show "-".
HISTORY_COLUMNS = (("reward", 3), ("accuracy", 3), ("clip_frac_low", 4), ("clip_frac_high", 4), ("entropy", 3),
                   ("completions/mean_length", 0), ("groups_filtered_frac", 2))


def _cell(row: dict[str, float], key: str, digits: int) -> str:
    return f"{row[key]:.{digits}f}" if key in row else "-"


@markdown_report
def render_markdown(report: dict[str, Any]) -> str:
    data, training, config = report["data"], report["training"], report["config"]
    title = f"GPPO RL ({config['task']}, loss {config['loss']}, ε_l {config['eps_low']}, ε_h {config['eps_high']}, α {config['sft_alpha']})"
    lines = [
        f"# {title}",
        "",
        f"Prompts: {data['read']} read, {data['kept']} trained on.",
        "",
        *common.skipped_table(data),
        "",
        common.steps_line(training)
        + f". Reward timeouts: {training['reward_timeouts']}. Lowest fill ratio: {training['fill_ratio_min']:.2f}"
        + (" (some steps trained on fewer informative groups than asked for)" if training["fill_ratio_min"] < 1 else "")
        + ".",
        "",
        "| step | reward | accuracy | clip low | clip high | entropy | length | filtered groups |",
        "|---|---|---|---|---|---|---|---|",
        *(f"| {int(r['step'])} | " + " | ".join(_cell(r, key, digits) for key, digits in HISTORY_COLUMNS) + " |"
          for r in report["history"]),
        "",
        *common.metrics_table(report["metrics"]),
        "",
    ]
    return "\n".join(lines)

