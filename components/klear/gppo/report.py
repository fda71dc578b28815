"""The gppo report as KFP metrics and as Markdown for the run's UI page."""

from __future__ import annotations

import math
from typing import Any


def metric_items(report: dict[str, Any]) -> list[tuple[str, float]]:
    """Flat (name, number) pairs: data counts, steps, reward timeouts, the run's figures. NaN/inf left out (KFP rejects them)."""
    data, training = report["data"], report["training"]
    items: list[tuple[str, float]] = [("records_read", data["read"]), ("records_kept", data["kept"])]
    items += [(f"skipped_{reason}", count) for reason, count in sorted(data["skipped"].items())]
    items += [("global_step", training["global_step"]), ("resumed_from_step", training["resumed_from_step"]),
              ("fill_ratio_min", training["fill_ratio_min"])]
    items += sorted(report["metrics"].items())
    return [(name, float(value)) for name, value in items if math.isfinite(float(value))]


# Rollout figures exist on the steps that generated; the others show "-".
HISTORY_COLUMNS = (("reward", 3), ("accuracy", 3), ("clip_frac_low", 4), ("clip_frac_high", 4), ("entropy", 3),
                   ("completions/mean_length", 0), ("groups_filtered_frac", 2))


def _cell(row: dict[str, float], key: str, digits: int) -> str:
    return f"{row[key]:.{digits}f}" if key in row else "-"


def render_markdown(report: dict[str, Any]) -> str:
    data, training, config = report["data"], report["training"], report["config"]
    title = f"GPPO RL ({config['task']}, loss {config['loss']}, ε_l {config['eps_low']}, ε_h {config['eps_high']}, α {config['sft_alpha']})"
    lines = [
        f"# {title}",
        "",
        f"Prompts: {data['read']} read, {data['kept']} trained on.",
        "",
        "| skipped because | records |",
        "|---|---|",
        *(f"| {reason} | {count} |" for reason, count in sorted(data["skipped"].items())),
        "",
        f"Optimizer steps: {training['global_step']} of {training['max_steps']}"
        + (f", resumed from step {training['resumed_from_step']}" if training["resumed_from_step"] else "")
        + f". Reward timeouts: {training['reward_timeouts']}. Lowest fill ratio: {training['fill_ratio_min']:.2f}"
        + (" (some steps trained on fewer informative groups than asked for)" if training["fill_ratio_min"] < 1 else "")
        + ".",
        "",
        "| step | reward | accuracy | clip low | clip high | entropy | length | filtered groups |",
        "|---|---|---|---|---|---|---|---|",
        *(f"| {int(r['step'])} | " + " | ".join(_cell(r, key, digits) for key, digits in HISTORY_COLUMNS) + " |"
          for r in report["history"]),
        "",
        "| metric | value |",
        "|---|---|",
        *(f"| {key} | {value:.6g} |" for key, value in sorted(report["metrics"].items())),
        "",
    ]
    return "\n".join(lines)

