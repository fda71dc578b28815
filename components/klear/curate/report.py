"""The human-readable summary of a curate run (report.md), rendered from report.json's content."""

from __future__ import annotations

from typing import Any

from klear.common.markdown import markdown_report


@markdown_report
def render_markdown(report: dict[str, Any]) -> str:
    totals = report["totals"]
    n = report["config"]["ngram_size"]
    lines = [
        "# Prompt curation",
        "",
        f"{totals['read']} prompts read, **{totals['kept']} kept**, {totals['removed']} removed "
        f"({report['elapsed_s']} s, {report['workers']} workers).",
    ]
    if report["empty_input"]:
        lines += ["", "The input held no prompts: the output is empty."]
    lines += [
        "",
        "| reason | prompts |",
        "|---|---|",
        f"| exact duplicate (after normalization) | {totals['duplicate']} |",
        f"| shares a {n}-gram with a test set | {totals['contaminated']} |",
        f"| shorter than {n} words, found inside a test item | {totals['short_match']} |",
        f"| empty after normalization | {totals['empty']} |",
        "",
        "## Per source",
        "",
        "| source | read | kept | duplicate | contaminated | short_match | empty |",
        "|---|---|---|---|---|---|---|",
    ]
    for source, c in report["per_source"].items():
        lines.append(
            f"| {source} | {c['read']} | {c['kept']} | {c['duplicate']} | {c['contaminated']} | "
            f"{c['short_match']} | {c['empty']} |"
        )
    lines += ["", "## Per test set", "", "| test set | items | items matched | prompts removed |", "|---|---|---|---|"]
    for name, c in report["per_benchmark"].items():
        lines.append(f"| {name} | {c['items']} | {c['items_matched']} | {c['prompts_removed']} |")
    if report.get("ids_qualified"):
        lines += ["", f"{report['ids_qualified']} kept prompts had an id an earlier kept prompt already had; "
                  "they are published as `<source>:<id>`."]
    short = report["short_prompts"]
    lines += [
        "",
        "## Short prompts",
        "",
        f"{short['count']} prompts have fewer than {n} words ({short['removed']} removed as short_match). "
        f"{short['note'].capitalize()}. They are listed in report.json.",
        "",
    ]
    return "\n".join(lines)
